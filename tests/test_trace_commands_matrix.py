"""The trace commands against every bad input kept here: each answered clearly, nothing lost.

Each bad input (a file or name among two good rank traces) is given to each command form that
reads traces: ``report FILE``, ``report DIR`` (to stdout and with ``-o``), ``merge``, ``convert``
of one file and ``convert DIR -o DIR``. What every case must show, whatever the command decides
(the bad file skipped and named, or the command refused):

* **answered clearly**: no traceback, no raw control character on the terminal, every line on
  stderr in polyprof's voice (``polyprof ...``), and a refusal is an exit status other than 0;
* **survived**: every input file is byte for byte what it was, no temporary file is left (next
  to an output, or a ``polyprof-report-*`` folder in ``$TMPDIR``), and an output named by
  ``-o`` is either absent (the command failed) or complete.

docs/cli.md states the size of this matrix; ``test_the_docs_state_the_size_of_the_matrix``
keeps that number true.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from polyprof.cli import main as cli_main

REPO_ROOT = Path(__file__).resolve().parents[1]
BASE_NS = 1_790_857_026_000_000_000
#: What no line may carry raw: C0 (but newline), DEL, C1, bidi controls.
RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def rank_doc(
    rank: int, world_size: int = 3, *, name: str = "aten::mm", rank_value: Any = None
) -> dict[str, Any]:
    """A small rank trace: two steps, each holding ``rank + 1`` ops (so that ranks read together show)."""
    events = []
    for step in range(2):
        ts = step * 200.0
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": 150.0,
            }
        )
        for n in range(rank + 1):
            op_ts = ts + 1 + 10 * n
            events.append(
                {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": op_ts, "dur": 5.0}
            )
    info = {"backend": "gloo", "rank": rank if rank_value is None else rank_value, "world_size": world_size}
    return {"baseTimeNanoseconds": BASE_NS, "distributedInfo": info, "traceEvents": events}


def write(path: Path, content: Any) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    return path


def plain_parquet(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1, 2, 3]}), path)
    return path


def parquet_with_text_ts(path: Path) -> Path:
    """A polyprof Parquet trace (converted from a good rank) whose ``ts`` column is then made text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = write(path.with_suffix(".src.json"), rank_doc(2))
    assert cli_main(["convert", str(source), str(path)]) == 0
    source.unlink()
    table = pq.read_table(path)
    index = table.schema.get_field_index("ts")
    text = pa.array([None if v is None else str(v) for v in table.column("ts").to_pylist()], pa.string())
    table = table.set_column(index, "ts", text)
    pq.write_table(table, path)
    return path


def symlink_loop(path: Path) -> Path:
    other = path.with_name("loop-b.json")
    os.symlink(other.name, path)
    os.symlink(path.name, other)
    return path


#: Bad inputs: name -> (file name in the run folder, a function writing it and returning its path).
BAD_INPUTS: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "empty file": ("r2.json", lambda p: write(p, b"")),
    "truncated JSON": ("r2.json", lambda p: write(p, json.dumps(rank_doc(2))[:80])),
    "binary garbage": ("r2.json", lambda p: write(p, bytes(range(256)) * 4)),
    "JSON list": ("r2.json", lambda p: write(p, [1, 2, 3])),
    "traceEvents not a list": ("r2.json", lambda p: write(p, {"traceEvents": {"a": 1}})),
    "event not an object": ("r2.json", lambda p: write(p, {"traceEvents": [1, "x", None]})),
    "corrupt gzip": ("r2.json.gz", lambda p: write(p, b"\x1f\x8b\x08\x00garbage")),
    "corrupt Parquet": ("r2.parquet", lambda p: write(p, b"PAR1 nothing here PAR1")),
    "Parquet of another tool": ("r2.parquet", plain_parquet),
    "Parquet with text ts": ("r2.parquet", parquet_with_text_ts),
    "rank as a string": ("r2.json", lambda p: write(p, rank_doc(2, rank_value="2"))),
    "rank as a float": ("r2.json", lambda p: write(p, rank_doc(2, rank_value=2.0))),
    "rank outside the world": ("r2.json", lambda p: write(p, rank_doc(7))),
    "a rank again": ("r2.json", lambda p: write(p, rank_doc(1))),
    "name with brackets": ("rank[01].json", lambda p: write(p, rank_doc(2))),
    "name with a star": ("r*.json", lambda p: write(p, rank_doc(2))),
    "name with a question mark": ("r?.json", lambda p: write(p, rank_doc(2))),
    "name with an escape sequence": ("\x1b[31mred.json", lambda p: write(p, rank_doc(2))),
    "op names with escape sequences": ("r2.json", lambda p: write(p, rank_doc(2, name="\x1b]0;owned\x07op"))),
    "op name with a lone surrogate": ("r2.json", lambda p: write(p, json.dumps(rank_doc(2, name="\ud800x")))),
    "NaN and infinite times": (
        "r2.json",
        lambda p: write(
            p,
            json.dumps(rank_doc(2))
            .replace('"ts": 1.0', '"ts": NaN')
            .replace('"dur": 150.0', '"dur": Infinity'),
        ),
    ),
    "symlink loop": ("loop-a.json", symlink_loop),
    "dangling symlink": ("r2.json", lambda p: (os.symlink("nowhere.json", p), p)[1]),
    "directory named like a trace": ("r2.json", lambda p: (p.mkdir(), p)[1]),
    "FIFO named like a trace": ("r2.json", lambda p: (os.mkfifo(p), p)[1]),
}

#: Bad inputs that are good traces of rank 2 all the same (a name that is odd, names or times inside).
READ_AS_RANK_2 = {
    "name with brackets",
    "name with a star",
    "name with a question mark",
    "name with an escape sequence",
    "op names with escape sequences",
    "op name with a lone surrogate",
    "NaN and infinite times",
}
#: ... and of those, the ones whose aten::mm events are all usable.
MM_OF_RANK_2 = {
    "name with brackets",
    "name with a star",
    "name with a question mark",
    "name with an escape sequence",
}

#: Command forms: name -> (argv from (run folder, bad file, output folder), the output path or None).
COMMANDS: dict[str, Callable[[Path, Path, Path], tuple[list[str], Path | None]]] = {
    "report FILE": lambda run, bad, out: (["report", str(bad)], None),
    "report DIR": lambda run, bad, out: (["report", str(run)], None),
    "report DIR -o": lambda run, bad, out: (
        ["report", str(run), "-o", str(out / "report.txt")],
        out / "report.txt",
    ),
    "merge": lambda run, bad, out: (["merge", str(run), "-o", str(out / "merged.json")], out / "merged.json"),
    "convert FILE": lambda run, bad, out: (
        ["convert", str(bad), str(out / "one.parquet")],
        out / "one.parquet",
    ),
    "convert DIR": lambda run, bad, out: (["convert", str(run), "-o", str(out / "converted")], None),
}

CASES = [(bad, command) for bad in BAD_INPUTS for command in COMMANDS]


def snapshot(folder: Path) -> dict[str, str | None]:
    """Every entry under ``folder``: a file's digest, None for anything else (link, folder, pipe)."""
    seen: dict[str, str | None] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    seen[path] = hashlib.sha256(handle.read()).hexdigest()
            else:
                seen[path] = None
    return seen


def leftovers(*folders: Path) -> list[str]:
    found = []
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            found += [
                os.path.join(root, n) for n in files if n.startswith(".polyprof-") and n.endswith(".tmp")
            ]
            found += [os.path.join(root, n) for n in dirs if n.startswith("polyprof-report-")]
    return found


def complete(path: Path) -> bool:
    """The output parses as what its suffix says."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.read_table(path)
        return True
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        json.loads(text)
    return bool(text)


@pytest.mark.parametrize(("bad", "command"), CASES, ids=[f"{b}|{c}" for b, c in CASES])
def test_answered_clearly_and_nothing_lost(
    bad: str, command: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    run, out, temp = tmp_path / "run", tmp_path / "out", tmp_path / "tmp"
    for folder in (run, out, temp):
        folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    write(run / "r0.json", rank_doc(0))
    write(run / "r1.json", rank_doc(1))
    name, make = BAD_INPUTS[bad]
    bad_path = make(run / name)
    argv, output = COMMANDS[command](run, bad_path, out)
    before = snapshot(run)
    capsys.readouterr()

    code = cli_main(argv)
    captured = capsys.readouterr()

    assert isinstance(code, int)
    for stream in (captured.out, captured.err):
        assert "Traceback" not in stream, stream
        assert not RAW_CONTROLS.search(stream), repr(stream)
    assert all(line.startswith("polyprof") for line in captured.err.splitlines() if line), captured.err
    assert snapshot(run) == before, "an input was changed"
    assert leftovers(tmp_path) == []
    if output is not None:
        assert (code == 0) == output.exists(), (code, captured.err)
        if code == 0:
            assert complete(output)


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
def test_the_report_numbers_are_those_of_the_ranks_read(bad: str, tmp_path: Path, capsys) -> None:
    """Each rank read once, as its own file: the ranks reported and their aten::mm calls."""
    run = tmp_path / "run"
    run.mkdir()
    write(run / "r0.json", rank_doc(0))
    write(run / "r1.json", rank_doc(1))
    name, make = BAD_INPUTS[bad]
    make(run / name)
    capsys.readouterr()
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected_ranks = [0, 1, 2] if bad in READ_AS_RANK_2 else [0, 1]
    assert [r["rank"] for r in data["ranks"]] == expected_ranks
    if bad == "NaN and infinite times":
        return  # some of rank 2's events are unusable; which is test_report_hostile's subject
    mm = next(op for op in data["ops"] if op["name"] == "aten::mm")
    with_mm = [0, 1, 2] if bad in MM_OF_RANK_2 else [0, 1]
    assert (mm["ranks"], mm["calls"]) == (len(with_mm), sum(2 * (rank + 1) for rank in with_mm))


def test_the_docs_state_the_size_of_the_matrix() -> None:
    docs = (REPO_ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    times = "\N{MULTIPLICATION SIGN}"
    stated = f"{len(BAD_INPUTS)} bad inputs {times} {len(COMMANDS)} command forms = {len(CASES)} cases"
    assert stated in docs, f"docs/cli.md should say: {stated}"
