#!/usr/bin/env bash
# The test command: set up the venv (and Chromium for the HTML report test), lint, then run pytest.
# The run keeps its scratch files (pytest's tmp_path, Spark's, the CLI runs') in one temp dir of its
# own, removed when the run passes and kept, with its path printed, when it fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup.sh"
# headless Chromium renders the audit HTML report in a test; install it when we can (root + apt)
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "rmqstore test: could not install chromium; the HTML rendering test will be skipped" >&2
fi
cd "$ROOT"
ruff check storelib datasources jobs tests
RUN_TMP="$(mktemp -d "${TMPDIR:-/tmp}/rmqstore-test-XXXXXX")"
rc=0
TMPDIR="$RUN_TMP" python -m pytest --basetemp="$RUN_TMP/pytest" "$@" || rc=$?
if [ "$rc" = 0 ]; then
  rm -rf "$RUN_TMP"
else
  echo "rmqstore test: scratch files of the failed run kept in $RUN_TMP" >&2
fi
exit "$rc"
