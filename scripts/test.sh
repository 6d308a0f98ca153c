#!/usr/bin/env bash
# Quick start, command 2: set up and run the tests, as CI does (.ci/run): the portable subset
# (pytest -m "torch_oracle or plugin_host") on the oldest torch and Python, on the newest torch on
# the GPU images' Python and pluggy, and on every dependency at its declared floor; then the whole
# suite on the pinned torch 2.13.0 (Python 3.11); then one line in pytest's format over all runs.
# Arguments go to the whole-suite run. See docs/torch-versions.md.
#   POLYPROF_TEST_MATRIX          the subset's runs (default below; "" skips them). A run is
#                                 VERSION[@PYTHON][,REQUIREMENT...] or floors (scripts/torch_matrix.py).
#                                 POLYPROF_TEST_TORCH_VERSIONS, its older name, is still read.
#   POLYPROF_TEST_CLEAN_VENVS=1   remove their venvs (.venvs/NAME, ~5 GB each) after their
#                                 run; the default where CI is set (a clean clone reuses nothing, and
#                                 one CI run ran out of disk with two on it). Elsewhere they stay for
#                                 the next run, which then needs no download, unless the next install
#                                 would not fit (scripts/torch_matrix.py). Removing one took 4 s on an
#                                 idle 2-core machine, 130 to 150 s on a loaded one.
source "$(dirname "${BASH_SOURCE[0]}")/_setup_env.sh"
cd "$ROOT"
# The GPU plugins, installed separately as users install them; on torch's CPU build they report
# "unavailable", and their device decoding is tested with stand-ins of torch's _KinetoEvents. Each
# carries its own tests (plugins_cuda/tests, plugins_xpu/tests), which the whole-suite run collects
# with tests/ (testpaths in pyproject.toml). HolisticTraceAnalysis reads our CUDA traces in
# plugins_cuda/tests/test_cuda_hta.py (HTA 0.5 needs pandas < 3). PyTorch Lightning is a real
# library that stops torch's profiler itself (its PyTorchProfiler calls
# torch.autograd._disable_profiler()): tests/test_outside_stop.py fits a model with it under
# polyprof, and skips that where Lightning is missing (the torch matrix runs). It keeps the installed
# torch (it asks torch>=2.1); with torchmetrics, aiohttp and their small dependencies, 5.6 MB of
# wheels, 33 MB installed, 8 s to install.
pip_install -e plugins_cuda -e plugins_xpu "HolisticTraceAnalysis>=0.5" "pandas<3" "lightning>=2.6,<3"

# Chromium, Debian's package, for the browser test of the HTML report (tests/test_rank_report_html.py;
# skipped without it). About 30 s where the package index is reachable.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
        || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; } \
        || echo "scripts/test.sh: could not install chromium; the HTML report's browser test is skipped" >&2
fi

# Lint first (the lint extra pins both; configuration in pyproject.toml): a finding fails the run
# before any test runs. mypy takes about 20 s without its cache (.mypy_cache), ruff under 1 s.
lint_started=$SECONDS
if ! "$VENV/bin/ruff" check .; then
    echo "scripts/test.sh: FAILED: ruff check found the problems above (ruff check --fix fixes some)" >&2
    exit 1
fi
if ! "$VENV/bin/ruff" format --check .; then
    echo "scripts/test.sh: FAILED: ruff format would reformat the files above (run: ruff format .)" >&2
    exit 1
fi
if ! "$VENV/bin/mypy"; then
    echo "scripts/test.sh: FAILED: mypy found the type errors above" >&2
    exit 1
fi
echo "lint: ruff check, ruff format --check and mypy passed in $((SECONDS - lint_started)) s"

# torch 2.6 on Python 3.10: the oldest of both. torch 2.15 on Python 3.12 with pluggy 1.6.0: the
# newest torch on what GPU images run (Python 3.12, pluggy 1.6, which once broke every profile).
# floors@3.11: torch 2.13.0 with every dependency at the floor pyproject.toml declares (pluggy 1.5,
# numpy 1.24, ...), on Python 3.11, which every floor has wheels for (numpy 1.24 has none for 3.12).
# The Pythons come from PATH or pyenv; a missing one is an error that says so.
DEFAULT_MATRIX="2.6.0@3.10 2.15.0@3.12,pluggy==1.6.0 floors@3.11"
MATRIX="${POLYPROF_TEST_MATRIX-${POLYPROF_TEST_TORCH_VERSIONS-$DEFAULT_MATRIX}}"
RESULTS="$ROOT/torch-matrix-results/test-sh"
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
CLEAN=
case "${CI:-}" in "" | false | 0) in_ci=0 ;; *) in_ci=1 ;; esac
[ "${POLYPROF_TEST_CLEAN_VENVS:-$in_ci}" = 1 ] && CLEAN=--clean
started=$SECONDS
runs=()
matrix_rc=0
set +e
if [ -n "$MATRIX" ]; then
    # Each torch but 2.13.0 is a CUDA build from the package index (3-5 GB, about 3 minutes); it
    # runs on the CPU. A machine-wide pip cap on torch does not apply to these installs.
    # shellcheck disable=SC2086  # one word per run
    "$PYTHON" scripts/torch_matrix.py $CLEAN --results "$RESULTS" --timeout 900 --install-timeout 900 \
        $MATRIX
    matrix_rc=$?  # 2: a malformed run, which wrote no result; 1: a run that did not pass
    for result in "$RESULTS"/*.json; do [ -e "$result" ] && runs+=("$result"); done
    echo
    echo "=== torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'): whole suite ==="
fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$RESULTS/torch-2.13.0-whole-suite.junit.xml" "$@"
main_rc=$?
# The runs above read torch's result with polyprof's compiled reader where a C++ compiler is present
# (tests/conftest.py); the differential subset runs once more with the pure-Python reader, the
# fallback where none is (polyprof.native.native_reader).
if [ -n "$MATRIX" ] && [ $# -eq 0 ]; then
    echo
    echo "=== torch 2.13.0: differential subset with the pure-Python reader ==="
    POLYPROF_KINETO_READER=python "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m torch_oracle \
        --junitxml="$RESULTS/torch-2.13.0-python-reader.junit.xml"
    python_rc=$?
    runs+=("$RESULTS/torch-2.13.0-python-reader.junit.xml")
    [ $main_rc -eq 0 ] && main_rc=$python_rc
fi
if [ ${#runs[@]} -eq 0 ]; then
    exit $main_rc  # pytest's own summary is the last line
fi
echo
echo "=== all runs ==="
"$PYTHON" scripts/torch_matrix.py --elapsed $((SECONDS - started)) \
    --summary "${runs[@]}" "$RESULTS/torch-2.13.0-whole-suite.junit.xml"
summary_rc=$?
[ $main_rc -ne 0 ] && exit $main_rc
[ $matrix_rc -ne 0 ] && exit $matrix_rc
exit $summary_rc
