#!/usr/bin/env python3
"""Run one of torch's own test files twice: with torch's profiler, then with polyprof's shims in place.

    python3 scripts/torch_tests_through_shim.py [--python PY] [--results DIR] TEST_FILE [-- PYTEST_ARGS]

``TEST_FILE`` is a test file from PyTorch's source tree for the installed torch, e.g. its
``test/profiler/test_profiler.py`` (torch's wheels do not ship their tests: take the file of the
release from its repository and put it anywhere outside this tree; its code is never committed here).
``--python`` is the interpreter of a venv with that torch, polyprof (editable) and ``expecttest``
(torch's test harness needs it), e.g. ``.venvs/torch-2.15.0-py3.12-pluggy-1.6.0/bin/python``.

The first run is torch alone, the reference: a test that fails there tests something this torch
does not have (a test file newer than the release) or this machine (no GPU), and says nothing about
polyprof. The second run installs ``polyprof.shim`` before pytest imports the file, so every
``torch.profiler.profile``, ``torch.autograd.profiler.profile`` and
``torch.autograd.profiler_legacy.profile`` the tests make is polyprof's, as under ``polyprof run``.
Both run from the test file's folder, so this tree's pytest configuration does not apply. The
summary gives each run's counts and the tests that pass with torch and fail with the shims; each
run's junit XML and log are written to ``--results`` (default ``torch-shim-results/``). Usage and
the counts measured: docs/torch-versions.md. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The second run's interpreter command: the shims in place before pytest imports the test file.
SHIMMED = "import sys, pytest, polyprof.shim; polyprof.shim.install(); sys.exit(pytest.main(sys.argv[1:]))"
PLAIN = "import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))"


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | error | skipped}`` from pytest's junit XML."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            result[test_id] = "failed"
        elif "error" in kinds:
            result[test_id] = "error"
        elif "skipped" in kinds:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def counts(results: dict[str, str]) -> str:
    tally = {kind: sum(1 for v in results.values() if v == kind) for kind in ("passed", "failed", "error")}
    skipped = sum(1 for v in results.values() if v == "skipped")
    return f"{tally['passed']} passed, {tally['failed']} failed, {tally['error']} errors, {skipped} skipped"


def run(python: str, code: str, test_file: Path, junit: Path, log: Path, extra: list[str]) -> dict[str, str]:
    junit.unlink(missing_ok=True)
    args = [python, "-c", code, test_file.name, "-q", "-rfE", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    with log.open("w") as out:
        subprocess.run(
            [*args, *extra], cwd=test_file.parent, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if not junit.exists():
        sys.exit(f"no results from {' '.join(args[:2])} ...: see {log}")
    return outcomes(junit)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="torch's test file, e.g. test/profiler/test_profiler.py")
    parser.add_argument("--python", default=sys.executable, help="the venv's interpreter (torch, polyprof)")
    parser.add_argument(
        "--results", type=Path, default=ROOT / "torch-shim-results", help="junit XML and logs"
    )
    opts = parser.parse_args(argv)
    test_file = opts.test_file.resolve()
    # absolute (runs start in the test file's folder), but not resolved: a venv's python is a link
    python = os.path.abspath(opts.python) if os.sep in opts.python else opts.python
    opts.results.mkdir(parents=True, exist_ok=True)
    stem = test_file.stem
    version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    torch_alone = run(
        python,
        PLAIN,
        test_file,
        opts.results / f"{stem}.torch.xml",
        opts.results / f"{stem}.torch.log",
        extra,
    )
    shimmed = run(
        python,
        SHIMMED,
        test_file,
        opts.results / f"{stem}.shim.xml",
        opts.results / f"{stem}.shim.log",
        extra,
    )
    print(f"torch {version}, {test_file.name}")
    print(f"  torch alone:      {counts(torch_alone)}")
    print(f"  through the shim: {counts(shimmed)}")
    bad = ("failed", "error")
    only_shim = sorted(t for t, v in shimmed.items() if v in bad and torch_alone.get(t) == "passed")
    both = sorted(t for t, v in shimmed.items() if v in bad and torch_alone.get(t) in bad)
    fixed = sorted(t for t, v in shimmed.items() if v == "passed" and torch_alone.get(t) in bad)
    print(f"  fail only through the shim ({len(only_shim)}):")
    for test_id in only_shim:
        print(f"    {test_id}")
    print(f"  fail with torch alone too ({len(both)}): {', '.join(both) or '-'}")
    if fixed:
        print(f"  pass only through the shim ({len(fixed)}): {', '.join(fixed)}")
    return 1 if only_shim else 0


if __name__ == "__main__":
    sys.exit(main())
