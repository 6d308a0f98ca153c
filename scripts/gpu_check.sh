#!/usr/bin/env bash
# The GPU check: polyprof-cuda against torch.profiler on this machine's NVIDIA GPU (tests/gpu).
#
#   scripts/gpu_check.sh [pytest args...]      from the repo root, on the GPU machine
#   scripts/gpu_check.sh --download-wheels     on a machine with network: fill shared/wheels
#
# What it does, offline:
#   1. prints the machine's facts (nvidia-smi, Python, torch and its CUDA, Triton, a C compiler);
#   2. installs, from the wheels in shared/wheels (or $POLYPROF_GPU_WHEELS), only what the machine
#      lacks, with --no-deps into /tmp/polyprof-gpu-site, first on PYTHONPATH: a wheel is carried
#      in only when the machine has no copy of its distribution, or one that does not satisfy what
#      polyprof's pyproject files (or the HTA check) declare; never a newer copy of something the
#      machine has (pluggy 1.6 on the nvidia-h200 image satisfies polyprof, so it is used). On that
#      image that means structlog and orjson, and for the HTA checks HolisticTraceAnalysis, plotly
#      and pydot (and pandas<3 if its pandas is 3: HTA 0.5 fails with pandas 3);
#   3. installs polyprof and polyprof-cuda from this checkout without network
#      (pip install --no-deps --no-build-isolation -e . -e plugins_cuda; where the machine's
#      setuptools cannot build them, setuptools < 77, the checkout goes on PYTHONPATH with
#      generated .dist-info entry points instead), builds polyprof's compiled reader
#      (`polyprof kineto-reader build`, into the cache the tests use) and prints `polyprof plugins`;
#   4. runs `python -m pytest -q tests/gpu` (extra arguments are passed on), with
#        POLYPROF_GPU_RESULTS  (default $OUT/gpu_results.jsonl): the measurements, JSON lines;
#        $OUT/gpu_junit.xml, $OUT/gpu_check.log, $OUT/gpu_traces.tar.gz (the Chrome traces,
#        when they fit in 15 MiB; else polyprof's and torch's of the eager workload only).
#      OUT defaults to /tmp/polyprof-gpu-check where it is unset. Exit status: pytest's, or 2
#      when something polyprof needs is missing.
#
# Time: the comparisons take about 4-6 minutes (5 workloads x 3 children: torch.profiler, polyprof and
# torch.profiler again for torch's own spread, the last without overhead loops; plus HTA), the soak
# POLYPROF_GPU_SOAK_S (300 s by default). Where one command may run 10 minutes at most, run it
# twice:   scripts/gpu_check.sh -k "not soak"    then    scripts/gpu_check.sh -k soak
# Other knobs (tests/gpu/conftest.py): POLYPROF_GPU_STEPS, POLYPROF_GPU_REPS,
# POLYPROF_GPU_OVERHEAD_REPS, POLYPROF_GPU_OVERHEAD_STEPS, POLYPROF_GPU_CHILD_TIMEOUT_S (300 here),
# POLYPROF_GPU_GRAPH_PREINIT=0 (capture the CUDA graph before any profiler ran),
# POLYPROF_GPU_TORCH_AGAIN=0 (no second torch.profiler child: torch's spread from its recordings only).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${POLYPROF_GPU_WHEELS:-$ROOT/shared/wheels}"
SITE="${POLYPROF_GPU_SITE:-/tmp/polyprof-gpu-site}"
#: what --download-wheels fetches (cp312 manylinux, no dependencies: the machine has the rest).
#: Carried in only where the machine lacks them (select_wheels); polyprof's needs are read from
#: its pyproject files, the HTA check's are HTA_NEEDS.
#: pandas 2 needs pytz and tzdata, which the nvidia-h200 image (pandas 3) lacks.
DOWNLOAD_SPECS=("structlog>=23.1" "orjson>=3.9" "HolisticTraceAnalysis==0.5.0" "plotly>=5.11" "pydot>=1.3" "pandas>=2,<3"
    "pytz>=2020.1" "tzdata>=2022.7")
#: what the HTA checks of tests/gpu need beside HTA's own dependencies (HTA 0.5 fails with pandas 3)
HTA_NEEDS="HolisticTraceAnalysis>=0.5 plotly>=5.11 pydot>=1.3 pandas>=2,<3"

download_wheels() {
    mkdir -p "$WHEELS"
    echo "downloading into $WHEELS (Python 3.12, x86-64 manylinux; no dependencies)"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "${DOWNLOAD_SPECS[@]}" 2>&1 \
        | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; }
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    ls -l "$WHEELS"
    du -sh "$WHEELS"
}

section() { printf '\n=== %s ===\n' "$*"; }

facts() {
    section "machine"
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    uname -srm
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi || true
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,persistence_mode --format=csv || true
    else
        echo "nvidia-smi: not found"
    fi
    echo "python: $(command -v "$PY") ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
    "$PY" - <<'EOF'
import importlib
try:
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"cuda available: {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        print(f"device 0: {torch.cuda.get_device_name(0)}, capability {torch.cuda.get_device_capability(0)}, "
              f"{torch.cuda.device_count()} device(s)")
except Exception as exc:
    print(f"torch: not usable: {exc!r}")
for name in ("triton", "pandas", "pytest", "setuptools"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as exc:
        print(f"{name}: not importable ({type(exc).__name__})")
EOF
    for cc in "${CC:-}" cc gcc; do
        if [ -n "$cc" ] && command -v "$cc" >/dev/null; then
            echo "C compiler: $cc: $("$cc" --version 2>/dev/null | head -1)"
            break
        fi
    done
}

# Prints the wheels of $WHEELS to install, one path a line, and why each is or is not (stderr):
# only those whose distribution the machine lacks or has in a version that does not satisfy what
# polyprof's pyproject files (polyprof, polyprof-cuda) or the HTA check declare.
select_wheels() {
    "$PY" - "$ROOT" "$WHEELS" "$HTA_NEEDS" <<'EOF'
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

root, wheels, hta_needs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split()
declared: dict[str, list[Requirement]] = {}
for project in (root / "pyproject.toml", root / "plugins_cuda" / "pyproject.toml"):
    for text in tomllib.loads(project.read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        declared.setdefault(canonicalize_name(requirement.name), []).append(requirement)
for text in hta_needs:
    requirement = Requirement(text)
    declared.setdefault(canonicalize_name(requirement.name), []).append(requirement)

newest = {}  # one wheel per distribution: two of one would make pip refuse the install
for wheel in wheels.glob("*.whl"):
    name, version, _, _ = parse_wheel_filename(wheel.name)
    key = canonicalize_name(name)
    if key not in newest or version > newest[key][1]:
        newest[key] = (wheel, version)
for wheel, _ in sorted(newest.values()):
    name, version, _, _ = parse_wheel_filename(wheel.name)
    key = canonicalize_name(name)
    wanted = declared.get(key, [])
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if key in ("polyprof", "polyprof-cuda"):
        print(f"skip {wheel.name}: polyprof comes from this checkout", file=sys.stderr)
    elif have is None:
        print(f"carry {wheel.name}: the machine has no {name}", file=sys.stderr)
        print(wheel)
    elif all(r.specifier.contains(have, prereleases=True) for r in wanted):
        print(f"skip {wheel.name}: the machine's {name} {have} satisfies what is declared", file=sys.stderr)
    elif all(r.specifier.contains(version, prereleases=True) for r in wanted):
        needs = ", ".join(str(r) for r in wanted)
        print(f"carry {wheel.name}: the machine's {name} {have} does not satisfy {needs}", file=sys.stderr)
        print(wheel)
    else:
        print(f"skip {wheel.name}: neither it nor the machine's {name} {have} satisfies it", file=sys.stderr)
EOF
}

install_wheels() {
    section "wheels"
    if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "no wheels in $WHEELS"
        return 0
    fi
    local listed
    listed="$(select_wheels)" || { echo "WARNING: could not choose among the wheels of $WHEELS"; return 0; }
    local chosen=()
    [ -n "$listed" ] && mapfile -t chosen <<<"$listed"
    if [ ${#chosen[@]} -eq 0 ]; then
        echo "nothing to carry in: the machine has every wheel's distribution in a version that satisfies"
        return 0
    fi
    rm -rf "$SITE"
    if "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE" "${chosen[@]}"; then
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        echo "installed into $SITE (first on PYTHONPATH): $(for w in "${chosen[@]}"; do basename "$w"; done | tr '\n' ' ')"
    else
        echo "WARNING: installing the wheels of $WHEELS failed"
    fi
}

check_modules() {
    section "polyprof's dependencies"
    # What polyprof and polyprof-cuda declare (their pyproject files), each with the version found.
    "$PY" - "$ROOT" <<'EOF'
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

root = Path(sys.argv[1])
missing = []
for project in (root / "pyproject.toml", root / "plugins_cuda" / "pyproject.toml"):
    for text in tomllib.loads(project.read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        if requirement.name == "polyprof":
            continue
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            print(f"{requirement.name}: MISSING ({requirement})")
            missing.append(requirement.name)
            continue
        ok = requirement.specifier.contains(have, prereleases=True)
        print(f"{requirement.name}: {have}" + ("" if ok else f" DOES NOT SATISFY {requirement}"))
        if not ok:
            missing.append(requirement.name)
sys.exit(2 if missing else 0)
EOF
    local rc=$?
    "$PY" -c "import pytest; print('pytest:', pytest.__version__)" 2>/dev/null || { echo "pytest: MISSING"; rc=2; }
    if "$PY" -c "import hta.trace_analysis" 2>/dev/null; then
        echo "hta: $("$PY" -c "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))" 2>/dev/null)"
        "$PY" -c "import pandas, sys; sys.exit(int(pandas.__version__.split('.')[0]) >= 3)" \
            || echo "WARNING: pandas $("$PY" -c 'import pandas; print(pandas.__version__)') with HTA 0.5: its breakdowns may fail; carry a pandas<3 wheel"
    else
        echo "hta: not importable: $("$PY" -c "import hta.trace_analysis" 2>&1 | tail -1)"
        echo "     the HTA checks will fail (carry HolisticTraceAnalysis, plotly, pydot, pandas<3, pytz, tzdata wheels)"
    fi
    if [ $rc -ne 0 ]; then
        echo
        echo "MISSING or too old: see above. Put their wheels (CPython 3.12, manylinux x86-64) in $WHEELS, for"
        echo "example with 'scripts/gpu_check.sh --download-wheels' on a machine with network, and run again."
        return 2
    fi
}

shim_install() {
    # The checkout on PYTHONPATH: the packages polyprof, polyprof_builtins and polyprof_cuda as
    # links, and .dist-info folders with the entry points from the pyproject files, which is all
    # polyprof's plugin discovery reads.
    local shim="/tmp/polyprof-gpu-shim"
    rm -rf "$shim" && mkdir -p "$shim" || return 1
    ln -s "$ROOT/core/polyprof" "$shim/polyprof"
    ln -s "$ROOT/plugins/polyprof_builtins" "$shim/polyprof_builtins"
    ln -s "$ROOT/plugins_cuda/polyprof_cuda" "$shim/polyprof_cuda"
    "$PY" - "$ROOT" "$shim" <<'EOF' || return 1
import re, sys, tomllib
from pathlib import Path
root, shim = Path(sys.argv[1]), Path(sys.argv[2])
for project in (root / "pyproject.toml", root / "plugins_cuda" / "pyproject.toml"):
    meta = tomllib.loads(project.read_text())["project"]
    # polyprof's version is dynamic, written once in core/polyprof/_version.py; polyprof-cuda's is static.
    version = meta.get("version") or re.search(
        r"""^__version__\s*=\s*["']([^"']+)["']""",
        (root / "core" / "polyprof" / "_version.py").read_text(),
        re.MULTILINE,
    ).group(1)
    info = shim / f"{meta['name'].replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {version}\n")
    groups = dict(meta.get("entry-points", {}))
    if meta.get("scripts"):
        groups["console_scripts"] = meta["scripts"]
    info.joinpath("entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
    )
    print(f"{info.name}: {sum(len(e) for e in groups.values())} entry points")
EOF
    export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
    echo "polyprof and polyprof-cuda from $ROOT through $shim (first on PYTHONPATH)"
}

install_polyprof() {
    section "polyprof and polyprof-cuda from the checkout"
    if "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation \
        -e "$ROOT" -e "$ROOT/plugins_cuda" >/tmp/polyprof-gpu-pip.log 2>&1; then
        echo "installed (editable)"
    else
        grep -E "Error|error:" /tmp/polyprof-gpu-pip.log | tail -3
        echo "pip could not install them editable (setuptools >= 77 is needed); using the checkout directly"
        shim_install || return 2
    fi
    "$PY" -c "import polyprof, polyprof_cuda; print('polyprof', polyprof.__file__); print('polyprof_cuda', polyprof_cuda.__file__)" \
        || return 2
    # The compiled reader, built ahead as docs/cli.md advises for clusters, into the cache the tests use
    # (tests/conftest.py): no child builds it inside the first profile it times.
    POLYPROF_CACHE_DIR="${POLYPROF_CACHE_DIR:-$ROOT/.cache/polyprof}" "$PY" -m polyprof kineto-reader build \
        || echo "WARNING: polyprof's compiled reader did not build; the tests read torch's results in Python"
    "$PY" - <<'EOF'
# the same question the tests ask: torch loaded, is CUDA recordable through torch's Kineto?
import io, contextlib, torch  # noqa: F401 - torch loaded, as in a user's program
from polyprof.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["plugins"])
print(out.getvalue())
line = next((l for l in out.getvalue().splitlines() if l.startswith("cuda ")), "")
if not line or "unavailable" in line or "failed" in line:
    print("WARNING: the cuda plugin is not loaded here; the comparisons will fail")
EOF
}

run_tests() {
    section "tests/gpu"
    local out_dir="$1"
    shift
    export POLYPROF_GPU_RESULTS="${POLYPROF_GPU_RESULTS:-$out_dir/gpu_results.jsonl}"
    # a hung child is reported (with its stacks) well inside a 10-minute command limit
    export POLYPROF_GPU_CHILD_TIMEOUT_S="${POLYPROF_GPU_CHILD_TIMEOUT_S:-300}"
    if [ -z "${POLYPROF_GPU_TRACE_DIR:-}" ]; then
        export POLYPROF_GPU_TRACE_DIR=/tmp/polyprof-gpu-traces
        rm -rf "$POLYPROF_GPU_TRACE_DIR"  # ours: this run's traces only
    fi
    mkdir -p "$POLYPROF_GPU_TRACE_DIR"
    echo "results: $POLYPROF_GPU_RESULTS; traces: $POLYPROF_GPU_TRACE_DIR"
    (cd "$ROOT" && PYTHONUNBUFFERED=1 "$PY" -m pytest -q -p no:cacheprovider tests/gpu \
        --durations=15 --junitxml="$out_dir/gpu_junit.xml" "$@")
    local rc=$?
    pack_traces "$out_dir"
    section "results ($POLYPROF_GPU_RESULTS)"
    "$PY" "$ROOT/tests/gpu/gpu_compare.py" "$POLYPROF_GPU_RESULTS" || true
    return $rc
}

pack_traces() {
    local out_dir="$1" archive="$1/gpu_traces.tar.gz"
    (cd "$POLYPROF_GPU_TRACE_DIR" && find . -name '*.json' | sort >/tmp/polyprof-gpu-traces.list)
    [ -s /tmp/polyprof-gpu-traces.list ] || return 0
    tar -czf "$archive" -C "$POLYPROF_GPU_TRACE_DIR" -T /tmp/polyprof-gpu-traces.list 2>/dev/null
    if [ "$(stat -c %s "$archive" 2>/dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ]; then
        (cd "$POLYPROF_GPU_TRACE_DIR" && grep -E '^\./eager/' /tmp/polyprof-gpu-traces.list >/tmp/polyprof-gpu-traces.list2)
        tar -czf "$archive" -C "$POLYPROF_GPU_TRACE_DIR" -T /tmp/polyprof-gpu-traces.list2 2>/dev/null
    fi
    echo "traces: $archive ($(du -h "$archive" | cut -f1))"
}

main() {
    local out_dir="$1"
    shift
    facts
    install_wheels
    check_modules || return 2
    install_polyprof || return 2
    run_tests "$out_dir" "$@"
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced: the functions only
if [ "${1:-}" = "--download-wheels" ]; then
    download_wheels
    exit $?
fi
OUT_DIR="${OUT:-/tmp/polyprof-gpu-check}"
mkdir -p "$OUT_DIR"
main "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
