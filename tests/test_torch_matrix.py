"""scripts/torch_matrix.py (the differential subset on other torch versions) and the subset's marker."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


matrix = load("torch_matrix", ROOT / "scripts" / "torch_matrix.py")
# By path: sys.modules["conftest"] is whichever of tests/, tests/cuda/, tests/xpu/ pytest imported last.
conftest = load("polyprof_tests_conftest", TESTS / "conftest.py")


def test_every_named_subset_file_exists():
    """A renamed test file would silently drop out of the subset that CI runs on 2.6 and 2.15."""
    named = [p for p in conftest.TORCH_ORACLE_FILES if "*" not in p]
    missing = [name for name in named if not (TESTS / name).exists()]
    assert not missing, f"TORCH_ORACLE_FILES names files that are not in tests/: {missing}"


def test_subset_selects_oracle_files_and_version_files_only():
    assert conftest._in_torch_oracle("test_differential.py")
    assert conftest._in_torch_oracle("test_torch_versions.py")
    assert conftest._in_torch_oracle("test_frontend_versions.py")
    assert not conftest._in_torch_oracle("test_bus.py")
    assert not conftest._in_torch_oracle("test_torch_matrix.py")  # needs no torch: not torch-version work


@pytest.fixture(scope="module")
def junit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A junit XML written by a real pytest run: 2 passed, 1 failed, 1 skipped, 1 error (read only)."""
    tmp_path = tmp_path_factory.mktemp("junit")
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def broken():
                raise RuntimeError("set-up fails")

            def test_ok(): pass
            def test_ok_too(): pass
            def test_bad(): assert 1 == 2
            def test_skip(): pytest.skip("no")
            def test_error(broken): pass
            """
        )
    )
    out = tmp_path / "sample.junit.xml"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={out}", "-ra"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    (tmp_path / "output.txt").write_text(result.stdout)
    return out


@pytest.mark.slow
def test_junit_counts(junit: Path):
    counts = matrix.read_junit(junit)
    assert (counts["passed"], counts["failed"], counts["errors"], counts["skipped"], counts["total"]) == (
        2,
        1,
        1,
        1,
        5,
    )
    ids = matrix.failed_ids((junit.parent / "output.txt").read_text().splitlines())
    assert sorted(ids) == ["ERROR test_sample.py::test_error", "FAILED test_sample.py::test_bad"]


@pytest.mark.slow
def test_summary_adds_runs_and_fails_if_any_failed(junit: Path, tmp_path: Path, capsys):
    passing = tmp_path / "torch-9.9.0.json"
    passing.write_text(
        json.dumps(
            {
                "torch_requested": "9.9.0",
                "status": "pass",
                "passed": 10,
                "failed": 0,
                "errors": 0,
                "skipped": 3,
            }
        )
    )
    assert matrix.summary([passing], elapsed_s=1.0) == 0
    assert matrix.summary([passing, junit], elapsed_s=12.5) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "======== 1 failed, 12 passed, 4 skipped, 1 error in 12.50s (all runs above) ========"


def test_a_broken_version_is_recorded_and_the_loop_goes_on(tmp_path: Path, capsys):
    """No venv can be made with /bin/false: each version is an error at phase 'venv', none aborts."""
    results = tmp_path / "results"
    code = matrix.main(
        [
            "--python",
            "/bin/false",
            "--venvs",
            str(tmp_path / "venvs"),
            "--results",
            str(results),
            "2.6.0",
            "2.15.0",
        ]
    )
    assert code == 1
    records = [json.loads((results / f"torch-{v}.json").read_text()) for v in ("2.6.0", "2.15.0")]
    assert [(r["status"], r["phase"], r["torch_requested"]) for r in records] == [
        ("error", "venv", "2.6.0"),
        ("error", "venv", "2.15.0"),
    ]
    out = capsys.readouterr().out
    label = 'torch 2.6.0 (-m "torch_oracle or plugin_host")'
    assert f"{label}: ERROR - no test results [venv: /bin/false -m venv failed" in out
    assert re.fullmatch(
        r"======== 0 passed, 2 errors in \d+\.\d\ds \(all runs above\) ========", out.strip().splitlines()[-1]
    )


def test_rejects_what_is_not_a_version(capsys):
    with pytest.raises(SystemExit) as exc:
        matrix.main(["2.6.0", "latest"])
    assert exc.value.code == 2
    assert (
        "not a torch version: latest (expected e.g. 2.6.0 or 2.13.0+cpu, or floors)"
        in capsys.readouterr().err
    )


def test_a_venv_is_removed_when_the_next_install_would_not_fit(tmp_path: Path, monkeypatch, capsys):
    """Without --clean, a venv goes when another version follows and the disk is short; the last stays.
    An install that runs out of disk says so with the free space (a stand-in pip prints pip's error)."""
    fake_python = tmp_path / "make_venv"
    fake_python.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            # "-m venv DIR": a venv whose python answers "-c pass" and whose pip runs out of disk
            mkdir -p "$3/bin"
            printf '#!/bin/sh\\n[ "$1" = -c ] && exit 0\\n'\\
            'echo "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"'\\
            '\\nexit 1\\n' > "$3/bin/python"
            chmod +x "$3/bin/python"
            """
        )
    )
    fake_python.chmod(0o755)
    monkeypatch.setattr(matrix, "free_bytes", lambda path: 3 * 2**30)
    venvs, results = tmp_path / "venvs", tmp_path / "results"
    argv = ["--python", str(fake_python), "--venvs", str(venvs), "--results", str(results)]
    assert matrix.main([*argv, "2.6.0", "2.15.0"]) == 1
    assert not (venvs / "torch-2.6.0").exists()
    assert (venvs / "torch-2.15.0" / "bin" / "python").exists()
    first = json.loads((results / "torch-2.6.0.json").read_text())
    assert (first["phase"], first["venv_removed"], first["disk_free_before_install"]) == (
        "install",
        True,
        "3.0 GiB",
    )
    assert first["detail"].startswith(
        "pip install torch==2.6.0 ran out of disk (3.0 GiB free now, 3.0 GiB before; it needs about 12.0 GiB)"
    )
    assert "venv_removed" not in json.loads((results / "torch-2.15.0.json").read_text())
    assert f"removing {venvs / 'torch-2.6.0'}: 3.0 GiB free" in capsys.readouterr().out


# ------------------------------------------------------------------------- runs


def test_a_run_names_torch_python_and_requirements() -> None:
    run = matrix.parse_run("2.15.0@3.12,pluggy==1.6.0")
    assert (run.torch, run.python, run.pins, run.floors) == ("2.15.0", "3.12", ("pluggy==1.6.0",), False)
    assert run.name == "torch-2.15.0-py3.12-pluggy-1.6.0"
    assert run.label == 'torch 2.15.0 on Python 3.12 with pluggy==1.6.0 (-m "torch_oracle or plugin_host")'
    assert (
        matrix.parse_run("2.6.0").name == "torch-2.6.0"
    )  # the result files of plain versions keep their name
    floors = matrix.parse_run("floors")
    assert (floors.torch, floors.floors, floors.name) == ("2.13.0", True, "floors-torch-2.13.0")
    assert floors.marker == "torch_oracle or plugin_host or optional_extras"


@pytest.mark.parametrize(
    ("word", "says"),
    [
        ("2.6.0@3", "not a Python version: 3 in 2.6.0@3 (expected e.g. 2.6.0@3.10)"),
        ("2.6.0,pluggy", "not a requirement: pluggy in 2.6.0,pluggy (expected e.g. pluggy==1.6.0)"),
        ("newest@3.12", "not a torch version: newest"),
    ],
)
def test_a_malformed_run_is_refused_naming_the_part(word: str, says: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        matrix.main([word])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_a_missing_python_is_an_error_that_says_where_it_looked(tmp_path: Path, monkeypatch, capsys) -> None:
    """Not a silent skip: the run is an error, the summary counts it, the exit status is 1."""
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.delenv("POLYPROF_PYTHON_3_99", raising=False)
    results = tmp_path / "results"
    argv = ["--venvs", str(tmp_path / "venvs"), "--results", str(results), "2.6.0@3.99"]
    assert matrix.main(argv) == 1
    record = json.loads((results / "torch-2.6.0-py3.99.json").read_text())
    assert (record["status"], record["phase"]) == ("error", "venv")
    assert record["detail"].startswith(
        "no Python 3.99 interpreter: looked for $POLYPROF_PYTHON_3_99, python3.99 on PATH and "
        f"{tmp_path / 'pyenv' / 'versions'}/3.99.*"
    )
    assert "0 passed, 1 error" in capsys.readouterr().out.strip().splitlines()[-1]


def test_a_python_is_found_by_the_version_it_reports(tmp_path: Path, monkeypatch) -> None:
    """A pyenv folder of another version, or a shim that runs another Python, is not taken."""
    current = "{}.{}".format(*sys.version_info[:2])
    liar = tmp_path / "pyenv" / "versions" / f"{current}.99" / "bin" / f"python{current}"
    liar.parent.mkdir(parents=True)
    liar.write_text("#!/bin/sh\necho 2.7\n")
    liar.chmod(0o755)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv(f"POLYPROF_PYTHON_{current.replace('.', '_')}", sys.executable)
    assert matrix.python_candidates(current)[0] == Path(sys.executable)
    assert liar in matrix.python_candidates(current)
    found, _ = matrix.find_python(current)
    assert found == sys.executable


#: pip's own words when a constraint rules the asked version out (pip 23 to 26).
PIP_CONFLICT = (
    "ERROR: Cannot install torch==2.15.0 because these package versions have conflicting dependencies."
)


def test_installs_ignore_a_machine_wide_pip_constraint(tmp_path: Path, capsys) -> None:
    """These machines cap pip at torch<=2.14.1 in /etc/xdg/pip: the run's install gets an empty
    constraints file, and a failed install is summarised by pip's cause, not its first line."""
    fake_python = tmp_path / "make_venv"
    fake_python.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            # "-m venv DIR": a venv whose pip notes PIP_CONSTRAINT's file and fails as pip does
            mkdir -p "$3/bin"
            cat > "$3/bin/python" <<'PY'
            #!/bin/sh
            [ "$1" = -c ] && exit 0
            cp "$PIP_CONSTRAINT" "$(dirname "$0")/constraint-seen.txt"
            echo "Obtaining file:///somewhere"
            echo "@CONFLICT@"
            echo ""
            echo "The conflict is caused by:"
            echo "    The user requested torch==2.15.0"
            echo "    The user requested (constraint) torch<=2.14.1"
            echo ""
            echo "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/"
            exit 1
            PY
            chmod +x "$3/bin/python"
            """
        ).replace("@CONFLICT@", PIP_CONFLICT)
    )
    fake_python.chmod(0o755)
    venvs, results = tmp_path / "venvs", tmp_path / "results"
    argv = ["--python", str(fake_python), "--venvs", str(venvs), "--results", str(results), "2.15.0"]
    assert matrix.main(argv) == 1
    seen = (venvs / "torch-2.15.0" / "bin" / "constraint-seen.txt").read_text()
    assert [line for line in seen.splitlines() if not line.startswith("#")] == []
    record = json.loads((results / "torch-2.15.0.json").read_text())
    assert record["detail"].splitlines()[0] == (
        "pip install torch==2.15.0 failed (exit code 1): Cannot install torch==2.15.0 because these package "
        "versions have conflicting dependencies; The user requested (constraint) torch<=2.14.1"
    )


def test_pips_cause_when_a_version_does_not_exist() -> None:
    output = [
        "ERROR: Could not find a version that satisfies the requirement ninja==1.11 (from versions: 1.5.3)",
        "ERROR: No matching distribution found for ninja==1.11",
    ]
    assert matrix.pip_cause(output) == "No matching distribution found for ninja==1.11"
    assert matrix.pip_cause([]) == "pip printed nothing"


# ----------------------------------------------------------------------- floors


def test_the_declared_floors_of_this_tree() -> None:
    """Every runtime dependency of polyprof and its plugin distributions has a floor that exists."""
    constraints, problems = matrix.dependency_floors()
    assert problems == []
    pinned = dict(line.split("==") for line in constraints)
    assert pinned["pluggy"] == "1.5"
    for name in ("anyio", "attrs", "structlog", "numpy", "orjson", "ninja", "pyarrow", "duckdb", "ray"):
        assert name in pinned, f"{name} has no floor in the floors run"


def _project(root: Path, folder: str, text: str) -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / "pyproject.toml").write_text(textwrap.dedent(text))


def test_floors_that_cannot_be_tested_are_named(tmp_path: Path, monkeypatch) -> None:
    _project(
        tmp_path,
        ".",
        """\
        [project]
        name = "polyprof"
        version = "0.3.0"
        dependencies = ["pluggy>=1.5,<2", "anyio", "numpy>=1.24"]
        [project.optional-dependencies]
        analysis = ["duckdb>=1.0"]
        """,
    )
    _project(
        tmp_path,
        "plugins_cuda",
        """\
        [project]
        name = "polyprof-cuda"
        version = "0.3.0"
        dependencies = ["polyprof>=0.2,<0.4", "numpy>=1.26"]
        """,
    )
    monkeypatch.setattr(matrix, "FLOOR_PROJECTS", {".": ("analysis",), "plugins_cuda": ()})
    constraints, problems = matrix.dependency_floors(tmp_path)
    assert constraints == ["duckdb==1.0", "numpy==1.26", "pluggy==1.5"]  # the higher of two floors
    assert problems == [
        "pyproject.toml: 'anyio' declares no floor (>=, == or ~=)",
        (
            "plugins_cuda/pyproject.toml: 'polyprof>=0.2,<0.4' has polyprof 0.2 as its floor, but this tree "
            "is polyprof 0.3.0, the only polyprof a floors run can install: make the floor 0.3"
        ),
    ]


# ---------------------------------------------------------------------- subsets


def test_marker_expressions_of_whole_subsets() -> None:
    assert conftest.selected_subsets("torch_oracle") == {"torch_oracle"}
    assert conftest.selected_subsets("torch_oracle or plugin_host or optional_extras") == set(
        conftest.SUBSETS
    )
    for other in ("", "not slow", "torch_oracle and not slow", "torch_oracle or", "gpu or torch_oracle"):
        assert conftest.selected_subsets(other) is None, other


def test_the_subsets_by_path() -> None:
    assert conftest.subsets_of(TESTS / "test_registry.py") == ["plugin_host"]
    assert conftest.subsets_of(TESTS / "test_differential.py") == ["torch_oracle"]
    assert conftest.subsets_of(ROOT / "plugins_cuda" / "tests" / "test_cuda_nvml.py") == ["optional_extras"]
    assert conftest.subsets_of(TESTS / "test_bus.py") == []
    for marker, patterns in conftest.SUBSETS.items():
        for pattern in patterns:
            assert list(ROOT.glob(pattern)), f"{marker}: {pattern} names no file"
