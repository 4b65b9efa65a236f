#!/usr/bin/env bash
# Find a Python 3.12+ interpreter and make .venv with the pinned requirements. Sourced by
# ./run and ./test; safe to run again (it reinstalls only when a requirements file changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="${1:-requirements-dev.txt}"

python_ok() {  # the interpreter runs (pyenv shims may exist and fail) and is 3.12+
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local c
  for c in "${OX_PYTHON:-}" python3.14 python3.13 python3.12 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && python_ok "$c" && { command -v "$c"; return; }
  done
  for c in $(ls -d "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
    python_ok "$c" && { echo "$c"; return; }
  done
  return 1
}

VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ] || ! python_ok "$VENV/bin/python"; then
  PY="$(find_python)" || { echo "oxproject needs Python 3.12 or newer; none found (set OX_PYTHON)." >&2; exit 1; }
  echo "Creating .venv with $PY ($("$PY" --version))"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.installed-$(cat "$ROOT"/requirements*.txt | sha1sum | cut -c1-12)-$(basename "$REQS")"
if [ ! -f "$STAMP" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/$REQS"
  touch "$STAMP"
fi
