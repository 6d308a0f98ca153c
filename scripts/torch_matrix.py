#!/usr/bin/env python3
"""Run polyprof's portable subset against other torch versions, Pythons and dependency versions.

    python3 scripts/torch_matrix.py [--clean] [--results DIR] RUN [RUN ...] [-- PYTEST_ARGS]
    python3 scripts/torch_matrix.py --summary FILE [FILE ...]   # FILE: a result .json or a junit .xml
    python3 scripts/torch_matrix.py --table [FILE ...]          # Markdown rows for docs/torch-versions.md

A RUN is ``VERSION[@PYTHON][,REQUIREMENT...]`` (``2.6.0``, ``2.6.0@3.10``,
``2.15.0@3.12,pluggy==1.6.0``: torch 2.15.0 on Python 3.12 with pluggy 1.6.0) or ``floors[@PYTHON]``
(torch 2.13.0 with every dependency that the pyproject files declare installed at its declared
floor, polyprof's pins in the plugin distributions included).

For each run, in turn: a venv at .venvs/NAME (made, or reused) from that Python (found on PATH or
in pyenv's versions; a missing one is an error that says where it looked), torch pinned and
polyprof (editable, with the test extras) installed into it, the subset run, one result line printed
and ``DIR/NAME.json`` (plus the junit XML) written. The subset is ``pytest -m "torch_oracle or
plugin_host"`` (tests/conftest.py), and for ``floors`` the optional extras' tests too. The installs
ignore a machine-wide pip constraint (``PIP_CONSTRAINT`` is an empty file for them), so the torch
asked for is the torch installed; an install that fails is summarised by pip's own cause. One run's
failure never stops the loop; the exit status is 1 when any run did not pass. ``--clean`` removes
each venv after its run (a CUDA build of torch takes about 5 GB); without it a venv is still
removed when the disk has less free space than the next install needs (``INSTALL_NEEDS_BYTES``).
Only the standard library is used: it runs before any venv exists. Usage and results:
docs/torch-versions.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
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
#: The subset every run takes: the tests that use torch as the oracle, and the plugin host's tests
#: (pluggy's hooks called plugin by plugin), which must hold on every pluggy the floors admit.
MARKER = "torch_oracle or plugin_host"
#: The floors run also takes the tests of the optional extras (pyarrow, duckdb, ray), whose floors
#: it installs.
FLOORS_MARKER = f"{MARKER} or optional_extras"
#: The torch of the whole suite (scripts/_setup_env.sh); the floors run uses it too.
PINNED_TORCH = "2.13.0"
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([a-z]+\d+)?(\+[\w.]+)?$")
PYTHON_RE = re.compile(r"^3\.\d+$")
#: One extra requirement of a run: ``pluggy==1.6.0`` (a name, an operator, a version).
PIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,.-]+\])?(===?|>=|<=|~=|!=|<|>)[\w.*+!-]+$")
#: The distributions of this tree (folders with a pyproject.toml) that the floors run installs with
#: every dependency at its floor, and for each the extras that are runtime dependencies (not test,
#: lint or benchmark tools): polyprof, the GPU plugins, and the plugin author guide's example.
FLOOR_PROJECTS = {
    ".": ("analysis", "itt", "ray"),
    "plugins_cuda": ("nvml",),
    "plugins_xpu": (),
    "docs/examples/polyprof-example-exporter": (),
}
#: pip names every file:// index location that does not exist on this machine: noise.
PIP_NOISE_RE = re.compile(r"^WARNING: Location 'file://.*' is ignored")
#: Of pip's other lines, those worth a log line (what it downloads, installs, and what goes wrong);
#: all of them are kept for the result file's detail when the install fails.
PIP_SHOWN_RE = re.compile(
    r"^\s*(Downloading|Installing collected|Successfully installed)|error|warning", re.IGNORECASE
)
#: pip's closing ERROR lines that only point elsewhere (the cause is in the lines before them).
PIP_POINTER_RE = re.compile(r"^ERROR: (ResolutionImpossible|To fix this|Could not find a version)")
#: Under pip's "The conflict is caused by:", the lines that rule a version out (a constraint, or a
#: dependency's own requirement), as opposed to "The user requested torch==X", the request itself.
PIP_CONFLICT_RE = re.compile(r"^\s+(The user requested \(constraint\) .*|\S+ \S+ depends on .*)$")
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
    from polyprof.base import torch_support
    info["polyprof_unsupported_reason"] = torch_support.unsupported_reason()
except Exception as exc:
    info["polyprof_probe_error"] = repr(exc)
import importlib.metadata as metadata
info["packages"] = {}
for name in ("pluggy", "anyio", "attrs", "structlog", "numpy", "orjson", "ninja", "pyarrow", "duckdb"):
    try:
        info["packages"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
print(json.dumps(info))
"""


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of the subset: a torch, a Python, extra requirements, or the dependency floors."""

    torch: str
    #: ``"3.10"``; None: the interpreter given with --python (by default the one running this).
    python: str | None = None
    #: Extra requirements, e.g. ``("pluggy==1.6.0",)``.
    pins: tuple[str, ...] = ()
    #: Every dependency at the floor its pyproject file declares.
    floors: bool = False

    @property
    def name(self) -> str:
        """The venv's and the result files' name: ``torch-2.15.0-py3.12-pluggy-1.6.0``."""
        parts = ["floors" if self.floors else "", f"torch-{self.torch}"]
        if self.python:
            parts.append(f"py{self.python}")
        parts.extend(re.sub(r"[^\w.]+", "-", pin) for pin in self.pins)
        return "-".join(p for p in parts if p)

    @property
    def marker(self) -> str:
        return FLOORS_MARKER if self.floors else MARKER

    @property
    def label(self) -> str:
        """How its result line starts: ``torch 2.6.0 on Python 3.10 (-m "...")``."""
        text = "dependency floors, torch " + self.torch if self.floors else "torch " + self.torch
        if self.python:
            text += f" on Python {self.python}"
        if self.pins:
            text += " with " + ", ".join(self.pins)
        return f'{text} (-m "{self.marker}")'


def parse_run(word: str) -> Run:
    """``2.6.0``, ``2.6.0@3.10``, ``2.15.0@3.12,pluggy==1.6.0``, ``floors``, ``floors@3.11``.

    :raises ValueError: naming the part that is wrong and what is expected.
    """
    head, *pins = word.split(",")
    torch, _, python = head.partition("@")
    floors = torch == "floors"
    if floors:
        torch = PINNED_TORCH
    elif not VERSION_RE.match(torch):
        raise ValueError(f"not a torch version: {torch} (expected e.g. 2.6.0 or 2.13.0+cpu, or floors)")
    if python and not PYTHON_RE.match(python):
        raise ValueError(f"not a Python version: {python} in {word} (expected e.g. 2.6.0@3.10)")
    bad = [pin for pin in pins if not PIN_RE.match(pin)]
    if bad:
        raise ValueError(f"not a requirement: {', '.join(bad)} in {word} (expected e.g. pluggy==1.6.0)")
    return Run(torch=torch, python=python or None, pins=tuple(pins), floors=floors)


def python_candidates(version: str) -> list[Path]:
    """Where a Python ``version`` ("3.10") may be: $POLYPROF_PYTHON_3_10, PATH, pyenv's versions."""
    found = []
    named = os.environ.get(f"POLYPROF_PYTHON_{version.replace('.', '_')}")
    if named:
        found.append(Path(named))
    on_path = shutil.which(f"python{version}")
    if on_path:
        found.append(Path(on_path))
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    installed = sorted(
        pyenv.glob(f"{version}.*/bin/python{version}"),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)],
        reverse=True,
    )
    found.extend(installed)
    return found


def find_python(version: str) -> tuple[str | None, str]:
    """An interpreter that reports ``version``, or None; and where it looked, for the error."""
    for candidate in python_candidates(version):
        try:
            said = subprocess.run(
                [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if said == version:
            return str(candidate), ""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    looked = (
        f"no Python {version} interpreter: looked for $POLYPROF_PYTHON_{version.replace('.', '_')}, "
        f"python{version} on PATH and {pyenv}/{version}.*; install one (e.g. pyenv install {version}) "
        f"or set POLYPROF_PYTHON_{version.replace('.', '_')} to its path"
    )
    return None, looked


_REQUIREMENT_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """``"0.2"`` -> ``(0, 2)``, ``"0.2.0"`` -> ``(0, 2)``: a release to compare, trailing zeros dropped."""
    numbers = [int(n) for n in re.match(r"\d+(\.\d+)*", version).group(0).split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def floor_of(specifier: str) -> str | None:
    """The lowest version ``specifier`` admits, as declared: ``>=1.5,<2`` -> ``1.5``; None if unbounded."""
    for clause in specifier.split(","):
        match = re.match(r"\s*(>=|==|~=|===)\s*([\w.+!-]+)\s*$", clause)
        if match and "*" not in match.group(2):
            return match.group(2)
    return None


def read_project(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise RuntimeError(
            f"reading {path.name} needs Python 3.11 or newer (tomllib); run this script with one"
        ) from None
    return tomllib.loads(path.read_text())["project"]


#: polyprof's one version (pyproject.toml declares it dynamic and reads it from here).
VERSION_FILE = Path("core/polyprof/_version.py")


def project_version(root: Path, project: dict) -> str:
    """A pyproject's version: its own ``version``, or, where it has none, ``VERSION_FILE``'s.

    The file is read, not imported (``__version__ = "..."``): the script runs before any venv exists.
    """
    if "version" in project:
        return project["version"]
    path = root / VERSION_FILE
    match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", path.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f'{path} assigns no __version__ = "..."')
    return match.group(1)


def dependency_floors(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """The constraints of a floors run (``name==floor``), and what is wrong with the declared floors.

    Every runtime dependency of the pyproject files in ``FLOOR_PROJECTS`` (their extras that
    are runtime dependencies included) must declare a floor; where two files name the same
    distribution, the higher floor is the one both can have. polyprof itself is this tree: each
    plugin distribution's pin of it must admit the tree's version and have it as its floor,
    because no other polyprof can be installed to check an older floor against.
    """
    problems: list[str] = []
    floors: dict[str, tuple[tuple[int, ...], str, str]] = {}
    core = read_project(root / "pyproject.toml")
    core_version = project_version(root, core)
    for folder, extras in FLOOR_PROJECTS.items():
        relative = (Path(folder) / "pyproject.toml").as_posix()
        project = read_project(root / relative)
        declared = list(project.get("dependencies", []))
        for extra in extras:
            declared += project.get("optional-dependencies", {}).get(extra, [])
        for text in declared:
            match = _REQUIREMENT_RE.match(text)
            if match is None:
                problems.append(f"{relative}: cannot read the requirement {text!r}")
                continue
            name, _extras, specifier, _marker = match.groups()
            floor = floor_of(specifier)
            if floor is None:
                problems.append(f"{relative}: {text!r} declares no floor (>=, == or ~=)")
                continue
            if canonical(name) == canonical(core["name"]):
                if release(floor) != release(core_version):
                    problems.append(
                        f"{relative}: {text!r} has polyprof {floor} as its floor, but this tree is "
                        f"polyprof {core_version}, the only polyprof a floors run can install: "
                        f"make the floor {'.'.join(map(str, release(core_version)))}"
                    )
                continue
            key = canonical(name)
            if key not in floors or release(floor) > floors[key][0]:
                floors[key] = (release(floor), name, floor)
    constraints = [
        f"{name}=={floor}" for _, name, floor in sorted(floors.values(), key=lambda f: f[1].lower())
    ]
    return constraints, problems


def pip_cause(output: list[str]) -> str:
    """Why pip failed, in its own words: its first telling ERROR line and what rules the version out.

    ``Cannot install torch==2.15.0 because these package versions have conflicting dependencies;
    The user requested (constraint) torch<=2.14.1``, never the first line pip printed
    (``Obtaining file:///...``).
    """
    errors = [
        line.strip().removeprefix("ERROR: ").rstrip(".") for line in output if line.startswith("ERROR: ")
    ]
    telling = [e for e in errors if not PIP_POINTER_RE.match("ERROR: " + e)]
    conflicts = [m.group(1) for line in output for m in [PIP_CONFLICT_RE.match(line)] if m]
    cause = (telling[:1] or errors[-1:]) + conflicts[:3]
    if cause:
        return "; ".join(cause)
    lines = [line.strip() for line in output if line.strip()]
    return lines[-1] if lines else "pip printed nothing"


def say(text: str) -> None:
    print(text, flush=True)


def run_streaming(
    cmd: list[str],
    timeout_s: float,
    *,
    cwd: Path = ROOT,
    shown: re.Pattern[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int | None, list[str]]:
    """Run ``cmd``, echoing its output (only lines matching ``shown`` if given, never pip's noise).

    Returns (exit code, or None when it ran past ``timeout_s`` and was killed; the output's last lines).
    """
    tail: collections.deque[str] = collections.deque(maxlen=200)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
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


def install_command(run: Run, python: Path, constraints: Path | None) -> list[str]:
    """pip's command line for ``run``: torch pinned, its extra requirements, polyprof editable."""
    command = [
        str(python),
        "-m",
        "pip",
        "install",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "--no-cache-dir",
        f"torch=={run.torch}",
        *run.pins,
    ]
    if run.floors:
        for folder, extras in FLOOR_PROJECTS.items():
            wanted = ["test", *extras] if folder == "." else list(extras)
            command += ["-e", str((ROOT / folder).resolve()) + (f"[{','.join(wanted)}]" if wanted else "")]
        if constraints is not None:
            command += ["-c", str(constraints)]
    else:
        command += ["-e", f"{ROOT}[test]"]
    return command


def run_version(run: Run, args: argparse.Namespace, pytest_args: list[str], *, last: bool = True) -> dict:
    """Set up, test and remove one run's venv (with --clean, or when the next install would not fit);
    never raises for the run's own failures."""
    venv = args.venvs / run.name
    python = venv / "bin" / "python"
    results: Path = args.results
    junit = results / f"{run.name}.junit.xml"
    record: dict = {
        "run": run.name,
        "label": run.label,
        "torch_requested": run.torch,
        "python_requested": run.python,
        "pins": list(run.pins),
        "floors": run.floors,
        "status": "error",
        "phase": "venv",
        "selection": f"-m {run.marker}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "polyprof_revision": git_revision(),
        "venv": str(venv),
    }
    say(f"\n=== {run.label}: {venv} ===")
    try:
        base_python = args.python
        if run.python is not None:
            base_python, looked = find_python(run.python)
            if base_python is None:
                record["detail"] = looked
                return record
        if not usable_python(venv):
            shutil.rmtree(venv, ignore_errors=True)
            created = subprocess.run(
                [base_python, "-m", "venv", str(venv)], check=False, capture_output=True, text=True
            )
            if created.returncode != 0:
                record["detail"] = f"{base_python} -m venv failed: {created.stderr.strip()[-2000:]}"
                return record

        record["phase"] = "install"
        results.mkdir(parents=True, exist_ok=True)
        constraints = None
        if run.floors:
            floors, problems = dependency_floors()
            record["floor_constraints"] = floors
            if problems:
                record["detail"] = "the declared floors cannot be installed as declared: " + "; ".join(
                    problems
                )
                return record
            constraints = results / f"{run.name}.constraints.txt"
            constraints.write_text(
                "# The floor of every runtime dependency the pyproject files declare (torch_matrix.py)\n"
                + "".join(f"{line}\n" for line in floors)
            )
        # A machine-wide pip constraint (these machines cap torch at the releases on their disk)
        # must not choose the torch a run asks for: the run's own requirements say what it tests.
        no_constraints = results / "no-machine-constraints.txt"
        no_constraints.write_text("# empty: the runs of torch_matrix.py install what they ask for\n")
        record["disk_free_before_install"] = gib(free_bytes(venv))
        say(
            f"installing torch=={run.torch}{''.join(' ' + p for p in run.pins)} and polyprof[test]"
            f"{' at the dependency floors' if run.floors else ''} (a CUDA build is 3-5 GB; minutes; "
            f"{record['disk_free_before_install']} free)"
        )
        started = time.monotonic()
        code, tail = run_streaming(
            install_command(run, python, constraints),
            args.install_timeout,
            shown=PIP_SHOWN_RE,
            env={**os.environ, "PIP_CONSTRAINT": str(no_constraints)},
        )
        record["install_s"] = round(time.monotonic() - started, 1)
        if code != 0:
            why = f"timed out after {args.install_timeout:.0f} s" if code is None else f"exit code {code}"
            detail = f"pip install torch=={run.torch} failed ({why}): {pip_cause(tail)}"
            if any("No space left on device" in line for line in tail):
                detail = (
                    f"pip install torch=={run.torch} ran out of disk ({gib(free_bytes(venv))} free now, "
                    f"{record['disk_free_before_install']} before; it needs about "
                    f"{gib(INSTALL_NEEDS_BYTES)})"
                )
            record["detail"] = detail + "\n" + "\n".join(tail[-20:])
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
                run.marker,
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
        if (args.clean or short_of_disk) and venv.exists():
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
        (results / f"{run.name}.json").write_text(json.dumps(record, indent=2) + "\n")


def counts_text(record: dict) -> str:
    if "total" not in record:
        return "no test results"
    return (
        f"{record['passed']} passed, {record['failed']} failed, {record['errors']} errors, "
        f"{record['skipped']} skipped"
    )


def result_line(record: dict) -> str:
    """One line per run: status, counts, what was really installed, where it stopped."""
    label = record.get("label") or f"torch {record.get('torch_requested', '?')} (-m {MARKER})"
    line = f"{label}: {record['status'].upper()} - {counts_text(record)}"
    facts = []
    if record.get("torch_version"):
        facts.append(f"torch {record['torch_version']}")
    if record.get("python_version"):
        facts.append(f"Python {record['python_version']}")
    packages = record.get("packages") or {}
    facts.extend(f"{name} {packages[name]}" for name in ("pluggy", "numpy") if name in packages)
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
    say("| torch | Python | pluggy | numpy | Result | Tests (subset) | Date | polyprof | run |")
    say("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        r = load_record(path)
        torch_text = r.get("torch_version") or r.get("torch_requested", "?")
        result = r["status"] + (f" ({r.get('phase')})" if r["status"] == "error" else "")
        packages = r.get("packages") or {}
        say(
            f"| {torch_text} | {r.get('python_version', '?')} | {packages.get('pluggy', '?')} | "
            f"{packages.get('numpy', '?')} | {result} | {counts_text(r)} | "
            f"{str(r.get('date', '?'))[:10]} | {r.get('polyprof_revision', '?')} | {r.get('run', '')} |"
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
        description=(
            'Run polyprof\'s portable subset (pytest -m "torch_oracle or plugin_host") against torch '
            "versions, Pythons and dependency floors."
        ),
        epilog=(
            "RUN: VERSION[@PYTHON][,REQUIREMENT...] (2.6.0, 2.6.0@3.10, 2.15.0@3.12,pluggy==1.6.0) or "
            "floors[@PYTHON] (torch 2.13.0, every dependency at its declared floor). Arguments after "
            "-- go to pytest. Usage and results: docs/torch-versions.md."
        ),
    )
    parser.add_argument("runs", nargs="*", metavar="RUN", help="what to install and test, e.g. 2.6.0@3.10")
    parser.add_argument("--clean", action="store_true", help="remove each venv after its run (~5 GB each)")
    parser.add_argument("--results", type=Path, default=ROOT / "torch-matrix-results", help="result files")
    parser.add_argument("--venvs", type=Path, default=ROOT / ".venvs", help="where the venvs go")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter of the runs that name no Python version"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for one run's tests")
    parser.add_argument("--install-timeout", type=float, default=1800, help="seconds for one install")
    parser.add_argument("--summary", nargs="+", type=Path, metavar="FILE", help="combine result files")
    parser.add_argument("--elapsed", type=float, help="with --summary: wall time to report, seconds")
    parser.add_argument("--table", nargs="*", type=Path, metavar="FILE", help="Markdown support-table rows")
    args = parser.parse_args(argv)

    if args.summary:
        return summary(args.summary, args.elapsed)
    if args.table is not None:
        paths = args.table or [Path(p) for p in glob.glob(str(args.results / "*torch-*.json"))]
        table(sorted(paths, key=version_key))
        return 0
    if not args.runs:
        parser.error("give at least one run, e.g. 2.6.0 or 2.6.0@3.10 or floors")
    runs = []
    for word in args.runs:
        try:
            runs.append(parse_run(word))
        except ValueError as exc:
            parser.error(str(exc))

    args.venvs = args.venvs.resolve()
    args.results = args.results.resolve()
    paths = []
    started = time.monotonic()
    for index, run in enumerate(runs):
        record = run_version(run, args, pytest_args, last=index == len(runs) - 1)
        say(result_line(record))
        paths.append(args.results / f"{run.name}.json")
    say("\n=== torch matrix ===")
    return summary(paths, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
