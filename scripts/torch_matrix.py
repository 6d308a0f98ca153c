#!/usr/bin/env python3
"""Run polyprof's differential subset (``pytest -m torch_oracle``) against given torch versions.

    python3 scripts/torch_matrix.py [--clean] [--results DIR] VERSION [VERSION ...] [-- PYTEST_ARGS]
    python3 scripts/torch_matrix.py --summary FILE [FILE ...]   # FILE: a result .json or a junit .xml
    python3 scripts/torch_matrix.py --table [FILE ...]          # Markdown rows for docs/torch-versions.md

For each version, in turn: a venv at .venvs/torch-VERSION (made, or reused), ``torch==VERSION`` and
polyprof (editable, with the test extras) installed into it, the subset run, one result line
printed and ``DIR/torch-VERSION.json`` (plus the junit XML) written. One version's failure never
stops the loop; the exit status is 1 when any version did not pass. ``--clean`` removes each venv
after its run (a CUDA build of torch takes about 5 GB); without it a venv is still removed when
the disk has less free space than the next install needs (``INSTALL_NEEDS_BYTES``). Only the
standard library is used: it runs before any venv exists. Usage and results: docs/torch-versions.md.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "torch_oracle"
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([a-z]+\d+)?(\+[\w.]+)?$")
#: pip names every file:// index location that does not exist on this machine: noise.
PIP_NOISE_RE = re.compile(r"^WARNING: Location 'file://.*' is ignored")
#: Of pip's other lines, those worth a log line (what it downloads, installs, and what goes wrong);
#: all of them are kept for the result file's detail when the install fails.
PIP_SHOWN_RE = re.compile(
    r"^\s*(Downloading|Installing collected|Successfully installed)|error|warning", re.IGNORECASE
)
#: Free space one CUDA build of torch needs while it installs: its wheels unpack beside the 5 to
#: 6 GB they install to (torch 2.15.0 with its nvidia packages). A CI run once ran out of disk
#: installing 2.15.0 with 2.6.0's venv still on it.
INSTALL_NEEDS_BYTES = 12 * 2**30
#: What the venv reports about itself, printed as one JSON line.
PROBE = """
import json, sys
info = {"python_version": sys.version.split()[0]}
try:
    import torch
    info["torch_version"] = str(torch.__version__)
    info["torch_cuda"] = torch.version.cuda
except Exception as exc:
    info["import_error"] = f"import torch: {exc!r}"
try:
    from polyprof import torch_support
    info["polyprof_unsupported_reason"] = torch_support.unsupported_reason()
except Exception as exc:
    info["polyprof_probe_error"] = repr(exc)
print(json.dumps(info))
"""


def say(text: str) -> None:
    print(text, flush=True)


def run_streaming(
    cmd: list[str], timeout_s: float, *, cwd: Path = ROOT, shown: re.Pattern[str] | None = None
) -> tuple[int | None, list[str]]:
    """Run ``cmd``, echoing its output (only lines matching ``shown`` if given, never pip's noise).

    Returns (exit code, or None when it ran past ``timeout_s`` and was killed; the output's last lines).
    """
    tail: collections.deque[str] = collections.deque(maxlen=200)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group, so a timeout kills pytest's children too
    )
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if PIP_NOISE_RE.match(line):
                continue
            if shown is None or shown.search(line):
                sys.stdout.write(line)
                sys.stdout.flush()
            tail.append(line.rstrip("\n"))
        code = proc.wait()
    finally:
        timer.cancel()
    return (None if timed_out.is_set() else code), list(tail)


def read_junit(path: Path) -> dict:
    """Counts from pytest's junit XML: passed, failed, errors, skipped, total, duration_s."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {"total": 0, "failed": 0, "errors": 0, "skipped": 0, "duration_s": 0.0}
    for suite in suites:
        counts["total"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        counts["duration_s"] += float(suite.get("time", 0.0))
    counts["passed"] = counts["total"] - counts["failed"] - counts["errors"] - counts["skipped"]
    return counts


def failed_ids(output_tail: list[str]) -> list[str]:
    """Node ids from pytest's short summary (``-ra``): ``FAILED tests/x.py::t - msg``."""
    ids = []
    for line in output_tail:
        match = re.match(r"^(FAILED|ERROR) (\S+)", line)
        if match:
            ids.append(f"{match.group(1)} {match.group(2)}")
    return ids


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{rev}-dirty" if dirty else rev


def usable_python(venv: Path) -> bool:
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    return subprocess.run([str(python), "-c", "pass"], check=False, capture_output=True).returncode == 0


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds ``path`` (or its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def run_version(version: str, args: argparse.Namespace, pytest_args: list[str], *, last: bool = True) -> dict:
    """Set up, test and remove one version (with --clean, or when the next install would not fit);
    never raises for the version's own failures."""
    venv = args.venvs / f"torch-{version}"
    python = venv / "bin" / "python"
    results: Path = args.results
    junit = results / f"torch-{version}.junit.xml"
    record: dict = {
        "torch_requested": version,
        "status": "error",
        "phase": "venv",
        "selection": f"-m {MARKER}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "polyprof_revision": git_revision(),
        "venv": str(venv),
    }
    say(f"\n=== torch {version}: {venv} ===")
    try:
        if not usable_python(venv):
            shutil.rmtree(venv, ignore_errors=True)
            created = subprocess.run(
                [args.python, "-m", "venv", str(venv)], check=False, capture_output=True, text=True
            )
            if created.returncode != 0:
                record["detail"] = f"{args.python} -m venv failed: {created.stderr.strip()[-2000:]}"
                return record

        record["phase"] = "install"
        record["disk_free_before_install"] = gib(free_bytes(venv))
        say(
            f"installing torch=={version} and polyprof[test] (a CUDA build is 3-5 GB; minutes; "
            f"{record['disk_free_before_install']} free)"
        )
        started = time.monotonic()
        code, tail = run_streaming(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--progress-bar",
                "off",
                "--disable-pip-version-check",
                "--no-cache-dir",
                f"torch=={version}",
                "-e",
                f"{ROOT}[test]",
            ],
            args.install_timeout,
            shown=PIP_SHOWN_RE,
        )
        record["install_s"] = round(time.monotonic() - started, 1)
        if code != 0:
            why = f"timed out after {args.install_timeout:.0f} s" if code is None else f"exit code {code}"
            detail = f"pip install torch=={version} failed ({why}): "
            if any("No space left on device" in line for line in tail):
                detail = (
                    f"pip install torch=={version} ran out of disk ({gib(free_bytes(venv))} free now, "
                    f"{record['disk_free_before_install']} before; it needs about "
                    f"{gib(INSTALL_NEEDS_BYTES)}): "
                )
            record["detail"] = detail + "\n".join(tail[-20:])
            return record

        record["phase"] = "import"
        probe = subprocess.run(
            [str(python), "-c", PROBE], check=False, capture_output=True, text=True, cwd=ROOT
        )
        try:
            record.update(json.loads(probe.stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            record["detail"] = f"probing the venv failed: {probe.stderr.strip()[-2000:]}"
            return record
        if "import_error" in record:
            record["detail"] = record.pop("import_error")
            return record

        record["phase"] = "tests"
        junit.unlink(missing_ok=True)
        started = time.monotonic()
        code, tail = run_streaming(
            [
                str(python),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                MARKER,
                f"--junitxml={junit}",
                *pytest_args,
            ],
            args.timeout,
        )
        record["tests_s"] = round(time.monotonic() - started, 1)
        record["pytest_exit_code"] = code
        record["failures"] = failed_ids(tail)
        summaries = [line for line in tail if re.search(r"\d+ (passed|failed|errors?|skipped)", line)]
        record["pytest_summary"] = summaries[-1].strip("= ") if summaries else None
        if code is None:
            record["detail"] = f"pytest timed out after {args.timeout:.0f} s"
            return record
        if not junit.exists():
            record["detail"] = f"pytest wrote no results (exit code {code})"
            return record
        record.update(read_junit(junit))
        if code == 0 and record["total"] > 0:
            record["status"] = "pass"
        elif code == 1:
            record["status"] = "fail"
        else:  # 2 interrupted or collection errors, 3 internal error, 4 usage, 5 nothing collected
            record["detail"] = f"pytest exit code {code}"
        return record
    except Exception as exc:  # noqa: BLE001  the harness's own failure, recorded; the loop goes on
        record["detail"] = f"{type(exc).__name__}: {exc}"
        return record
    finally:
        short_of_disk = not last and free_bytes(venv) < INSTALL_NEEDS_BYTES
        if args.clean or short_of_disk:
            if short_of_disk and not args.clean:
                say(
                    f"removing {venv}: {gib(free_bytes(venv))} free, the next install needs about "
                    f"{gib(INSTALL_NEEDS_BYTES)}"
                )
            started = time.monotonic()
            shutil.rmtree(venv, ignore_errors=True)
            record["venv_removed"] = not venv.exists()
            record["clean_s"] = round(time.monotonic() - started, 1)
        results.mkdir(parents=True, exist_ok=True)
        (results / f"torch-{version}.json").write_text(json.dumps(record, indent=2) + "\n")


def counts_text(record: dict) -> str:
    if "total" not in record:
        return "no test results"
    return (
        f"{record['passed']} passed, {record['failed']} failed, {record['errors']} errors, "
        f"{record['skipped']} skipped"
    )


def result_line(record: dict) -> str:
    """One line per version: status, counts, what was really installed, where it stopped."""
    label = record.get("label") or f"torch {record.get('torch_requested', '?')} (-m {MARKER})"
    line = f"{label}: {record['status'].upper()} - {counts_text(record)}"
    facts = []
    if record.get("torch_version"):
        facts.append(f"torch {record['torch_version']}")
    if record.get("python_version"):
        facts.append(f"Python {record['python_version']}")
    for key, name in (("install_s", "install"), ("tests_s", "tests"), ("clean_s", "clean")):
        if key in record:
            facts.append(f"{name} {record[key]:.0f} s")
    if facts:
        line += f" ({', '.join(facts)})"
    if record["status"] == "error":
        detail = (record.get("detail") or "").strip().splitlines()
        line += f" [{record.get('phase')}: {detail[0] if detail else 'see log'}]"
    return line


def load_record(path: Path) -> dict:
    """A result JSON, or a junit XML made into a record (the 2.13 whole-suite run of scripts/test.sh)."""
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if not path.exists():
        return {"label": path.name, "status": "error", "phase": "tests", "detail": "no results written"}
    label = path.name.removesuffix(".junit.xml").removesuffix(".xml").replace("-", " ")
    record = {"label": label, **read_junit(path)}
    record["status"] = "pass" if record["failed"] == record["errors"] == 0 and record["total"] else "fail"
    return record


def summary(paths: list[Path], elapsed_s: float | None = None) -> int:
    """Print each run's line and a last line in pytest's format over all runs; 1 if any did not pass."""
    records = [load_record(p) for p in paths]
    for record in records:
        say(result_line(record))
    total = collections.Counter()
    for record in records:
        for key in ("passed", "failed", "errors", "skipped"):
            total[key] += record.get(key, 0)
    broken = [r for r in records if r["status"] == "error"]
    parts = [f"{total['failed']} failed"] if total["failed"] else []
    parts.append(f"{total['passed']} passed")
    if total["skipped"]:
        parts.append(f"{total['skipped']} skipped")
    errors = total["errors"] + len(broken)  # a version that never reached pytest counts as one error
    if errors:
        parts.append(f"{errors} error" + ("s" if errors > 1 else ""))
    duration = elapsed_s if elapsed_s is not None else sum(r.get("duration_s", 0.0) for r in records)
    say(f"======== {', '.join(parts)} in {duration:.2f}s (all runs above) ========")
    return 0 if all(r["status"] == "pass" for r in records) else 1


def table(paths: list[Path]) -> None:
    """Markdown rows for the support table in docs/torch-versions.md."""
    say("| torch | Python | Result | Tests (differential subset) | Date | polyprof |")
    say("|---|---|---|---|---|---|")
    for path in paths:
        r = load_record(path)
        torch_text = r.get("torch_version") or r.get("torch_requested", "?")
        result = r["status"] + (f" ({r.get('phase')})" if r["status"] == "error" else "")
        say(
            f"| {torch_text} | {r.get('python_version', '?')} | {result} | {counts_text(r)} | "
            f"{str(r.get('date', '?'))[:10]} | {r.get('polyprof_revision', '?')} |"
        )


def version_key(path: Path) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", path.stem)[:3])


def main(argv: list[str]) -> int:
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="torch_matrix.py",
        description="Run polyprof's differential subset (pytest -m torch_oracle) against torch versions.",
        epilog="Arguments after -- go to pytest. Usage and results: docs/torch-versions.md.",
    )
    parser.add_argument("versions", nargs="*", help="torch versions to install and test, e.g. 2.6.0 2.15.0")
    parser.add_argument("--clean", action="store_true", help="remove each venv after its run (~5 GB each)")
    parser.add_argument("--results", type=Path, default=ROOT / "torch-matrix-results", help="result files")
    parser.add_argument("--venvs", type=Path, default=ROOT / ".venvs", help="where the venvs go")
    parser.add_argument("--python", default=sys.executable, help="interpreter the venvs are made from")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for one version's tests")
    parser.add_argument("--install-timeout", type=float, default=1800, help="seconds for one install")
    parser.add_argument("--summary", nargs="+", type=Path, metavar="FILE", help="combine result files")
    parser.add_argument("--elapsed", type=float, help="with --summary: wall time to report, seconds")
    parser.add_argument("--table", nargs="*", type=Path, metavar="FILE", help="Markdown support-table rows")
    args = parser.parse_args(argv)

    if args.summary:
        return summary(args.summary, args.elapsed)
    if args.table is not None:
        paths = args.table or [Path(p) for p in glob.glob(str(args.results / "torch-*.json"))]
        table(sorted(paths, key=version_key))
        return 0
    if not args.versions:
        parser.error("give at least one torch version, e.g. 2.6.0")
    bad = [v for v in args.versions if not VERSION_RE.match(v)]
    if bad:
        parser.error(f"not a torch version: {', '.join(bad)} (expected e.g. 2.6.0 or 2.13.0+cpu)")

    args.venvs = args.venvs.resolve()
    args.results = args.results.resolve()
    paths = []
    started = time.monotonic()
    for index, version in enumerate(args.versions):
        record = run_version(version, args, pytest_args, last=index == len(args.versions) - 1)
        say(result_line(record))
        paths.append(args.results / f"torch-{version}.json")
    say("\n=== torch matrix ===")
    return summary(paths, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
