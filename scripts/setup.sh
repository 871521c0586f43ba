#!/usr/bin/env bash
# Shared set-up for a fresh machine: a Python venv with rmqstore and its deps, and a Java check for Spark.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again (it only installs what is missing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RMQSTORE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if ! command -v "$PY" >/dev/null 2>&1; then
  echo "rmqstore setup: $PY not found; install Python 3.10 or newer" >&2; exit 2
fi
"$PY" - <<'PYEOF' || { echo "rmqstore setup: Python 3.10 or newer is required" >&2; exit 2; }
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PYEOF

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "rmqstore setup: Spark needs a Java runtime (17 or 21) and none was found." >&2
  echo "  install one, e.g.: sudo apt-get install -y openjdk-17-jre-headless   (or set JAVA_HOME)" >&2
  exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.rmqstore-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # setuptools warns on every editable install that a folder named like a package could shadow it
  # (storelib/ here is the package itself): that one message only, every other warning still shows
  PYTHONWARNINGS="ignore:Editable installation:UserWarning" "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  touch "$stamp"
fi
# our modules' bytecode, as a regular (non-editable) pip install compiles it: an editable install leaves
# it to the first import, which never writes it where PYTHONDONTWRITEBYTECODE is set (then every command
# compiled ~70 modules at its start, 0.2-0.4 s); a stale file is ignored by Python, so this is always safe
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/storelib" "$ROOT/jobs" "$ROOT/datasources" >/dev/null
export PATH="$VENV/bin:$PATH"
export PYSPARK_PYTHON="$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
