# Sourced by the quick-start scripts: a venv with CPU torch 2.13.0 and polyprof (editable).
# torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${POLYPROF_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
# pip names every file:// index location that does not exist on this machine: noise, dropped.
# The pipeline keeps pip's exit status (pipefail).
pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; }
}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip_install "torch==2.13.0"
pip_install -e "$ROOT[test,itt,lint,analysis,ray]"
