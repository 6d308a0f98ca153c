"""polyprof reads torch's real GPU traces and writes them again as Kineto would (tests/data/kineto_gpu).

Holistic Trace Analysis is the reader that notices: it joins device rows to their launches by
``correlation`` and drops what it cannot join. A range's GPU span written with polyprof's device
args (``device``, ``stream``, ``correlation``) instead of Kineto's ``{"External id": N}`` vanished
from HTA's view of polyprof's traces on an H200, with one more step's kernels (issue 24). Here HTA
must see in polyprof's rewrite exactly what it sees in torch's own file. Needs no torch.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from polyprof.formats.chrome_reader import load_chrome_trace, trace_from_chrome
from polyprof.runtime.chrome_trace import write_chrome_trace

DATA = Path(__file__).parent / "data" / "kineto_gpu"
TRACES = sorted(p.name for p in DATA.glob("*.json.gz"))
WITH_RANGE_SPANS = [name for name in TRACES if name.startswith("h200_")]


def _rewrite(name: str, tmp_path: Path) -> tuple[Path, Path]:
    original = tmp_path / "torch" / "rank0.json"
    original.parent.mkdir()
    original.write_bytes(gzip.decompress((DATA / name).read_bytes()))
    rewritten = tmp_path / "polyprof" / "rank0.json"
    rewritten.parent.mkdir()
    write_chrome_trace(trace_from_chrome(load_chrome_trace(original)), rewritten)
    return original, rewritten


def _events(path: Path, category: str) -> list[dict[str, Any]]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == category]


@pytest.mark.parametrize("name", WITH_RANGE_SPANS)
def test_range_spans_are_written_as_kineto_writes_them(name: str, tmp_path: Path) -> None:
    original, rewritten = _rewrite(name, tmp_path)

    def spans(path: Path) -> list[tuple[str, int, int, Any]]:
        rows = _events(path, "gpu_user_annotation")
        return sorted((e["name"], e["pid"], e["tid"], e["args"]) for e in rows)

    assert spans(original), name
    assert spans(rewritten) == spans(original)
    # every span's "External id" is its range's, on the host
    ranges = {e["args"]["External id"] for e in _events(rewritten, "user_annotation")}
    assert {args["External id"] for *_, args in spans(rewritten)} <= ranges


@pytest.mark.parametrize("name", TRACES)
def test_hta_sees_in_polyprofs_rewrite_what_it_sees_in_torchs_trace(name: str, tmp_path: Path) -> None:
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    from gpu_compare import hta_summary

    original, rewritten = _rewrite(name, tmp_path)
    theirs = hta_summary(original.parent)
    ours = hta_summary(rewritten.parent)
    assert ours == theirs
