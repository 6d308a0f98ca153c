#!/usr/bin/env bash
# Quick start, command 2: set up and run the whole test suite.
source "$(dirname "${BASH_SOURCE[0]}")/_setup_env.sh"
cd "$ROOT"
# The GPU plugins, installed separately as users install them; with no GPU here they report
# "unavailable", which is what their no-hardware tests exercise. cupti-python (cu13 extra) and
# intel-pti are the real bindings the decoders are tested against; HolisticTraceAnalysis reads
# our CUDA traces in tests/cuda/test_cuda_hta.py (HTA 0.5 needs pandas < 3).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -e "plugins_cuda[cu13]" -e plugins_xpu "HolisticTraceAnalysis>=0.5" "pandas<3"
# Debian's Level Zero loader, for polyprof-xpu's "loader without zesInit" path: best effort,
# only where we may install system packages (root with apt); those tests skip without it.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! ldconfig -p | grep -q libze_loader.so.1; then
    apt-get install -y -qq libze1 >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libze1 >/dev/null 2>&1; } \
        || echo "note: could not install libze1; the tests that need it will skip" >&2
fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
