"""The worked example of the plugin author guide, end to end.

The example distribution (docs/examples/polyprof-example-exporter) is
installed on its own (pip, into a separate directory), found by polyprof
through its entry point, and used by name from a real profile.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # every test runs pip or python -m polyprof in a subprocess

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "polyprof-example-exporter"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("example-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(EXAMPLE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def run_with(site: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_discovered_and_listed(example_site: Path) -> None:
    out = run_with(
        example_site, "from polyprof.cli import main; raise SystemExit(main(['plugins', '--json']))"
    )
    assert out.returncode == 0, out.stderr
    plugins = {p["name"]: p for p in json.loads(out.stdout)}
    assert plugins["example_csv"]["status"] == "loaded"
    assert plugins["example_csv"]["distribution"] == "polyprof-example-exporter"
    assert "csv" in json.dumps(plugins["example_csv"])


def test_used_by_name_from_a_profile(example_site: Path, tmp_path: Path) -> None:
    target = tmp_path / "ops.csv"
    out = run_with(
        example_site,
        """
        import sys, torch, polyprof
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
            with polyprof.record_function("block"):
                torch.ones(8).mul(2).sum()
        print(prof.export(sys.argv[1], format="csv"))
        """,
        str(target),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(target)
    with open(target, newline="") as f:
        rows = list(csv.DictReader(f))
    names = {r["name"] for r in rows}
    assert {"block", "aten::mul", "aten::sum"} <= names


def test_unknown_exporter_lists_installed_ones(example_site: Path, tmp_path: Path) -> None:
    out = run_with(
        example_site,
        """
        import sys, torch, polyprof
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
            torch.ones(2).sum()
        prof.export(sys.argv[1], format="feather")
        """,
        str(tmp_path / "x.feather"),
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "feather" in last and "csv" in last and "chrome" in last and "parquet" in last
    assert not (tmp_path / "x.feather").exists()
