#!/usr/bin/env bash
# The main job on an embedded default: generate a store, rebuild its ConsumeQueue and IndexFile with
# Spark (local[2]) and audit it. Output goes to ./demo-store (the generated store) and ./out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup.sh"
cd "$ROOT"
STORE="${1:-$ROOT/demo-store}"
OUT="${2:-$ROOT/out}"
if [ ! -d "$STORE/commitlog" ]; then
  rmqstore gen "$STORE" --messages 200000 --seed 7 --segment-size 64MB
fi
rmqstore info "$STORE"
rm -rf "$OUT/rebuild"
rmqstore rebuild "$STORE" --out "$OUT/rebuild" --engine spark --master 'local[2]'
rc=0
rmqstore audit "$STORE" --engine spark --report-dir "$OUT/audit" || rc=$?
echo "audit exit code: $rc (0 clean, 1 findings, 2 could not run); report: $OUT/audit/audit.html"
exit "$rc"
