"""``polyprof report DIR --format html``: one self-contained page, opened in a real headless Chromium.

Chromium comes from Debian's package (scripts/test.sh installs it where it can); without it the
browser tests are skipped and the page is still checked as HTML.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from polyprof.cli import main as cli_main
from test_rank_report import synthetic_rank, write_json

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# No network, no profile, no sandbox (CI runs as root): what a headless check needs.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def page(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    times = {0: [100.0, 100.0], 1: [101.0, 99.0], 2: [140.0, 139.0]}
    for rank, steps in times.items():
        doc = synthetic_rank(rank, 3, steps)
        doc["traceEvents"].append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "<script>alert(1)</script>",
                "pid": 1,
                "tid": 1,
                "ts": 5000.0,
                "dur": 3.0,
            }
        )
        write_json(run / f"r{rank}.json", doc)
    (run / "broken.json").write_text("{")
    out = tmp_path / "report.html"
    assert cli_main(["report", str(run), "--format", "html", "-o", str(out)]) == 0
    return out


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def elements(text: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(text)
    return parser.tags


def test_the_page_is_self_contained_and_escapes_what_traces_name(page: Path) -> None:
    text = page.read_text()
    tags = elements(text)
    assert not [t for t, a in tags if t == "script" or a.get("src") or (t == "link" and a.get("href"))]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    bars = [a for t, a in tags if t == "rect" and a.get("class") == "rank-bar"]
    assert [b["data-rank"] for b in bars] == ["0", "1", "2"]
    assert [b["fill"] for b in bars] == ["#4e79a7", "#4e79a7", "#f28e2b"]  # rank 2 is the straggler
    assert "Stragglers (ratio at least 1.10): rank 2 (1.39x)." in text
    assert "broken.json" in text  # the skipped trace is named on the page too


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium package)")
def test_chromium_renders_the_page_with_its_plots(page: Path, tmp_path: Path) -> None:
    profile = tmp_path / "chromium-profile"
    common = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    tags = elements(dom)
    svgs = {a.get("id") for t, a in tags if t == "svg"}
    assert {"step-times", "top-ops"} <= svgs
    assert len([a for t, a in tags if t == "rect" and a.get("class") == "op-bar"]) >= 3
    assert not [t for t, a in tags if t == "script"]  # the escaped name stayed text in the browser's DOM
    shot = tmp_path / "page.png"
    subprocess.run(
        [*common, "--window-size=900,1200", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page with plots, not a blank one


def test_a_page_of_one_rank_says_1_rank(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_json(run / "r0.json", synthetic_rank(0, 1, [100.0]))
    out = tmp_path / "report.html"
    assert cli_main(["report", str(run), "--format", "html", "-o", str(out)]) == 0
    text = out.read_text()
    assert "<title>polyprof report: 1 rank</title>" in text
    assert "<h1>polyprof report: 1 rank</h1>" in text and "1 ranks" not in text
