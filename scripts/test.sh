#!/usr/bin/env bash
# Quick start, command 2: set up and run the whole test suite.
source "$(dirname "${BASH_SOURCE[0]}")/_setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
