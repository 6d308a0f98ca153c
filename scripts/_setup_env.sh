# Sourced by the quick-start scripts: a venv with CPU torch 2.13.0 and polyprof (editable).
# torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${POLYPROF_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test,itt]"
