#!/usr/bin/env bash
# Quick start, command 1: set up, profile a small model, print the table, write a trace.
source "$(dirname "${BASH_SOURCE[0]}")/_setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" "$ROOT/docs/examples/quickstart.py" "$@"
