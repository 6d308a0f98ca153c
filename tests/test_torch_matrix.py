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
    assert "torch 2.6.0 (-m torch_oracle): ERROR - no test results [venv: /bin/false -m venv failed" in out
    assert re.fullmatch(
        r"======== 0 passed, 2 errors in \d+\.\d\ds \(all runs above\) ========", out.strip().splitlines()[-1]
    )


def test_rejects_what_is_not_a_version(capsys):
    with pytest.raises(SystemExit) as exc:
        matrix.main(["2.6.0", "latest"])
    assert exc.value.code == 2
    assert "not a torch version: latest" in capsys.readouterr().err


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
