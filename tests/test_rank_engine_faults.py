"""The many-rank analysis engine under faults: file names that look like globs, Ctrl-C, terminal
escapes in the traces, out of memory, and a Ray cluster that is not there.

Each test builds its ranks as ``test_rank_report`` does (small synthetic Kineto traces whose numbers
are known) and runs ``polyprof report`` as a user would: in this process, or as a real command where
a signal or a hang is what is tried.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from polyprof.base.terminal import terminal_safe
from polyprof.cli import main as cli_main
from polyprof.formats.columnar import write_parquet_trace
from polyprof.ranks import rank_analysis
from test_rank_report import synthetic_rank, write_json

CORE = Path(__file__).resolve().parents[1] / "core"


def write_trace(path: Path, doc: dict[str, Any]) -> Path:
    """``doc`` at ``path``, as JSON or Parquet by its suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        return Path(write_parquet_trace(doc, path))
    return write_json(path, doc)


def report_json(*args: Any, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli_main(["report", *map(str, args), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def numbers(data: dict[str, Any]) -> dict[str, Any]:
    """What the analysis computed, without the file names."""
    return {key: data[key] for key in ("ops", "kernels", "steps", "stragglers", "step_percentiles_us")}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "polyprof", *args]


def command_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(CORE), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# ------------------------------------------------------------ item 1: names read as globs

#: Rank 0 runs 2 steps, rank 1 three: one aten::add per step, so aten::add's calls are 5 in all,
#: and a rank that reads another's file too (or instead) changes them.
STEPS = {0: [100.0, 110.0], 1: [200.0, 210.0, 220.0]}

GLOB_NAMES = [
    pytest.param({0: "rank0.json", 1: "rank[01].json"}, id="brackets-json-reads-rank0"),
    pytest.param({0: "rank*.json", 1: "rank1.json"}, id="star-json-mixes-both"),
    pytest.param({0: "rank?.parquet", 1: "rank1.parquet"}, id="question-parquet-mixes-both"),
    pytest.param({0: "rank0.parquet", 1: "rank[01].parquet"}, id="brackets-parquet-reads-rank0"),
    pytest.param({0: "a\\[0].parquet", 1: "a\\[0]*.json"}, id="backslash-and-globs"),
    pytest.param({0: "**.json", 1: "{0,1}.json"}, id="double-star-and-braces"),
]


@pytest.mark.parametrize("names", GLOB_NAMES)
@pytest.mark.parametrize("folder", ["run", "run[1]*?"])
def test_a_file_name_that_looks_like_a_glob_is_read_as_that_file_only(
    tmp_path: Path, capsys, monkeypatch, names: dict[int, str], folder: str
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temporary))  # where the engine's links would be left
    odd, plain = tmp_path / folder, tmp_path / "plain"
    for rank, steps in STEPS.items():
        doc = synthetic_rank(rank, 2, steps)
        write_trace(odd / names[rank], doc)
        write_trace(plain / f"r{rank}{Path(names[rank]).suffix}", doc)
        # what a glob of the folder's name would read instead: another folder, the same names
        write_trace(tmp_path / "run1-decoy" / names[rank], synthetic_rank(rank, 2, [5.0] * 7))
    got = report_json(odd, capsys=capsys)
    assert [r["source"] for r in got["ranks"]] == [str(odd / names[0]), str(odd / names[1])]
    assert got["skipped"] == []
    add = next(op for op in got["ops"] if op["name"] == "aten::add")
    assert add["calls"] == 5 and add["slowest_rank"] == 1
    assert {s["rank"]: s["steps"] for s in got["steps"]} == {0: 2, 1: 3}
    assert numbers(got) == numbers(report_json(plain, capsys=capsys))
    assert list(temporary.iterdir()) == []  # the temporary Parquet traces and the links are gone


def test_the_engine_reads_a_glob_like_parquet_path_as_that_file(tmp_path: Path) -> None:
    """The unit of work both engines run, called with a Parquet path next to files its glob matches."""
    for rank, steps in STEPS.items():
        write_trace(tmp_path / f"rank{rank}.parquet", synthetic_rank(rank, 2, steps))
    path = write_trace(tmp_path / "rank[01].parquet", synthetic_rank(0, 2, [5.0] * 7))
    with rank_analysis.connect() as connection:
        rows = rank_analysis.rows_of_rank(connection, str(path), 0)
    assert next(op.calls for op in rows.ops if op.name == "aten::add") == 7


def test_a_name_with_backslashes_and_no_glob_character_is_read_without_a_link(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Every Windows path holds backslashes, and a link there needs a privilege (a symbolic one) or
    the same drive (a hard one): such a name goes to DuckDB as it is. DuckDB takes ``\\`` as a
    separator there and as a character here; either way, without ``*?[``, it reads that one file."""

    def no_links(target: str, link: str) -> None:
        raise OSError(f"cannot link {target}: links need a privilege here")

    monkeypatch.setattr(rank_analysis, "_link", no_links)
    odd, plain = tmp_path / "run\\1", tmp_path / "plain"
    for rank, steps in STEPS.items():
        write_trace(odd / f"r\\{rank}.parquet", synthetic_rank(rank, 2, steps))
        write_trace(plain / f"r{rank}.parquet", synthetic_rank(rank, 2, steps))
    got = report_json(odd, capsys=capsys)
    assert got["skipped"] == []
    assert [r["source"] for r in got["ranks"]] == [str(odd / "r\\0.parquet"), str(odd / "r\\1.parquet")]
    assert numbers(got) == numbers(report_json(plain, capsys=capsys))


# ------------------------------------------------------------ item 2: Ctrl-C

#: ``python -m polyprof`` with the first rank's analysis held in a DuckDB query that runs until it is
#: stopped; it says on stderr when that query starts.
SLOW_FIRST_RANK = textwrap.dedent(
    """
    import sys
    from polyprof.ranks import rank_analysis
    from polyprof.cli import main

    real = rank_analysis.rows_of_rank
    held = []

    def slow(connection, path, rank):
        if not held:
            held.append(rank)
            print("QUERY RUNNING", file=sys.stderr, flush=True)
            connection.sql("select count(*) from range(1000000000000000)").fetchall()
        return real(connection, path, rank)

    rank_analysis.rows_of_rank = slow
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a process is POSIX's")
# DuckDB loses a SIGINT that lands as its query starts (about 20 ms in, here): the delays try both
@pytest.mark.parametrize("delay_s", [0.0, 0.02, 0.5])
def test_ctrl_c_during_the_analysis_stops_the_command_with_130_and_no_report(
    tmp_path: Path, delay_s: float
) -> None:
    run = tmp_path / "run"
    for rank, steps in STEPS.items():
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 2, steps))
    script = tmp_path / "slow_polyprof.py"
    script.write_text(SLOW_FIRST_RANK)
    process = subprocess.Popen(
        [sys.executable, str(script), "report", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=command_env(),
    )
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:  # the command's own warnings may come first
            seen.append(line)
            if line.strip() == "QUERY RUNNING":
                break
        assert seen and seen[-1].strip() == "QUERY RUNNING", "".join(seen)
        time.sleep(delay_s)  # before, as and after the query starts: each must end the command
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert out == ""
    assert "polyprof report: interrupted" in err
    assert "skipped" not in err and "analysis failed" not in err and "Traceback" not in err


def test_duckdbs_interrupt_is_no_ranks_failure(tmp_path: Path, monkeypatch) -> None:
    """DuckDB gives Ctrl-C as ``RuntimeError: Query interrupted``; the engine raises KeyboardInterrupt."""
    path = write_trace(tmp_path / "r0.parquet", synthetic_rank(0, 1, [100.0]))

    def interrupted(connection: Any, path: str, rank: int) -> Any:
        raise RuntimeError("Query interrupted")

    monkeypatch.setattr(rank_analysis, "rows_of_rank", interrupted)
    with rank_analysis.connect() as connection, pytest.raises(KeyboardInterrupt):
        rank_analysis.rows_or_failure(connection, str(path), 0)


def test_ctrl_c_on_a_ray_worker_stops_the_command(tmp_path: Path, monkeypatch, capsys) -> None:
    """Ray reports a worker's KeyboardInterrupt as the task cancelled: that stops the run too."""
    ray = pytest.importorskip("ray")
    from polyprof.ranks import rank_ray

    class CancelledDataset:
        def map(self, fn: Any) -> CancelledDataset:
            return self

        def take_all(self) -> list[Any]:
            raise ray.exceptions.TaskCancelledError()

    class FakeRay:
        exceptions = ray.exceptions
        data = type("data", (), {"from_items": staticmethod(lambda items, **kw: CancelledDataset())})

        def is_initialized(self) -> bool:
            return True  # joined already: nothing to start or shut down

    monkeypatch.setattr(rank_ray, "ray_module", FakeRay)
    run = tmp_path / "run"
    write_json(run / "r0.json", synthetic_rank(0, 1, [100.0]))
    assert cli_main(["report", str(run), "--engine", "ray"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and "interrupted" in captured.err


# ------------------------------------------------------------ item 7: terminal escapes

EVIL = "\x1b[2J\x1b]0;owned\x07aten::\x9bevil\r"


def evil_rank(rank: int) -> dict[str, Any]:
    doc = synthetic_rank(rank, 2, [100.0])
    doc["distributedInfo"]["backend"] = "gl\x1b[5moo"
    doc["traceEvents"].append(
        {"ph": "X", "cat": "cpu_op", "name": EVIL, "pid": 1, "tid": 1, "ts": 500.0, "dur": 3.0}
    )
    doc["traceEvents"].append(
        {"ph": "X", "cat": "kernel", "name": "gemm\x1b[31m", "pid": 0, "tid": 7, "ts": 9.0, "dur": 4.0}
    )
    return doc


def test_names_from_the_traces_reach_the_terminal_escaped(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank in range(2):
        write_json(run / f"r\x1b[1m{rank}.json", evil_rank(rank))
    assert cli_main(["report", str(run), "--per-rank", "--row-limit", "-1"]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\x9b\r")
    assert terminal_safe(EVIL) in out  # as the single-trace report writes it: "\\x1b[2J..."
    assert "gemm\\x1b[31m" in out and "backend gl\\x1b[5moo" in out
    assert f"Rank 1 ({run}/r\\x1b[1m1.json)" in out
    # the JSON report keeps every name exactly (JSON escapes them)
    data = report_json(run, capsys=capsys)
    assert EVIL in {op["name"] for op in data["ops"]} and data["backend"] == "gl\x1b[5moo"


# ------------------------------------------------------------ item 9: out of memory


def big_rank(rank: int) -> dict[str, Any]:
    return synthetic_rank(rank, 2, [float(10 + i % 7) for i in range(30_000)])


def test_out_of_memory_in_every_rank_is_said_once_naming_the_traces(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank in range(2):
        write_json(run / f"r{rank}.json", big_rank(rank))
    assert cli_main(["report", str(run), "--memory-limit", "1MB"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    expected = (
        "polyprof report: error: none of the 2 ranks could be analysed: DuckDB ran out of memory under "
        f"--memory-limit 1MB: raise the limit ({run / 'r0.json'}, {run / 'r1.json'})"
    )
    assert lines == [expected]


def test_when_every_rank_fails_the_traces_skipped_as_they_were_read_are_named_too(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A corrupt trace and a second trace of a rank, left out before the analysis: the error, the
    command's only output, names them with the ranks that failed."""
    import duckdb

    run = tmp_path / "run"
    for rank in range(2):
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 2, [100.0]))
    write_json(run / "s1-copy.json", synthetic_rank(1, 2, [100.0]))
    (run / "broken.json").write_text("{")

    def out_of_memory(connection: Any, path: str, rank: int) -> Any:
        raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block of size 256.0 KiB")

    monkeypatch.setattr(rank_analysis, "rows_of_rank", out_of_memory)
    assert cli_main(["report", str(run), "--memory-limit", "1GB"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(
        "polyprof report: error: none of the 2 ranks could be analysed: DuckDB ran out of memory under "
        f"--memory-limit 1GB: raise the limit ({run / 'r0.json'}, {run / 'r1.json'}); also skipped: "
    )
    assert f"{run / 'broken.json'}: " in line
    assert f"{run / 's1-copy.json'}: rank 1 again: {run / 'r1.json'} is kept" in line


def test_a_rank_out_of_memory_is_one_line_naming_its_trace(tmp_path: Path, capsys, monkeypatch) -> None:
    """One rank of two runs out of memory (made to, as where it differs is the machine's business)."""
    import duckdb

    run = tmp_path / "run"
    for rank in range(2):
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 2, [100.0]))
    real = rank_analysis.rows_of_rank

    def out_of_memory_on_rank_1(connection: Any, path: str, rank: int) -> Any:
        if rank == 1:
            raise duckdb.OutOfMemoryException(
                "Out of Memory Error: could not allocate block of size 256.0 KiB"
            )
        return real(connection, path, rank)

    monkeypatch.setattr(rank_analysis, "rows_of_rank", out_of_memory_on_rank_1)
    keep = tmp_path / "parquet"
    assert cli_main(["report", str(run), "--memory-limit", "1GB", "--parquet-dir", str(keep)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("1 rank (world size 2, backend gloo), ")
    expected = (
        f"polyprof report: skipped {run / 'r1.json'}: DuckDB ran out of memory under --memory-limit 1GB: "
        "raise the limit"
    )
    assert captured.err.splitlines() == [expected]
    # -vv: the traceback too, for a bug report
    assert cli_main(["-vv", "report", str(run), "--memory-limit", "1GB", "--parquet-dir", str(keep)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" in err and "rank_analysis_failed" in err


# ------------------------------------------------------------ item 11: an unreachable Ray cluster


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report_on_ray(tmp_path: Path, address: str) -> subprocess.CompletedProcess[str]:
    run = tmp_path / "run"
    write_json(run / "r0.json", synthetic_rank(0, 1, [100.0]))
    try:
        return subprocess.run(
            command("report", str(run), "--engine", "ray", "--ray-address", address),
            capture_output=True,
            text=True,
            timeout=90,  # ray.init alone would wait for minutes
            env=command_env(),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"polyprof report --ray-address {address} still waits after {exc.timeout} s")


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_address_where_nothing_listens_is_one_line(tmp_path: Path, scheme: str) -> None:
    pytest.importorskip("ray")
    address = f"{scheme}127.0.0.1:{closed_port()}"
    done = report_on_ray(tmp_path, address)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        f"polyprof report: error: no Ray cluster answers at --ray-address {address} ("
    )
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_a_ray_address_that_never_answers_is_given_up_after_a_few_seconds(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with socket.socket() as silent:  # accepts connections (the kernel does) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        done = report_on_ray(tmp_path, address)
    assert done.returncode == 2 and done.stdout == ""
    expected = (
        f"polyprof report: error: no Ray cluster answers at --ray-address {address} (no answer within 5 s): "
        "check that the cluster runs ('ray status' on its head node), that the address is its GCS "
        "(port 6379 by default), and that a firewall lets this machine reach it"
    )
    # the one error line; whatever else Ray's import may warn about, no traceback
    assert expected in done.stderr.splitlines(), done.stderr
    assert "Traceback" not in done.stderr


RAY_ADDRESSES = [
    pytest.param("127.0.0.1:6379", ("127.0.0.1", 6379), id="gcs"),
    pytest.param("ray://head.example:10001", ("head.example", 10001), id="client"),
    pytest.param("[::1]:6379", ("::1", 6379), id="gcs-ipv6"),
    pytest.param("ray://[::1]:10001", ("::1", 10001), id="client-ipv6"),
    pytest.param(None, None, id="none-a-local-cluster"),
    pytest.param("auto", None, id="auto"),
    pytest.param("local", None, id="local"),
    pytest.param("ray://head.example", None, id="client-without-port"),  # gRPC's default port
    pytest.param("anyscale://my-cluster", None, id="another-schemes-client"),  # its ClientBuilder
    pytest.param("head.example", None, id="host-only"),  # ray.init says what is wrong with it
]


@pytest.mark.parametrize(("address", "tried"), RAY_ADDRESSES)
def test_an_address_with_a_port_is_tried_and_any_other_goes_to_ray_init_unchanged(
    monkeypatch, address: str | None, tried: tuple[str, int] | None
) -> None:
    from polyprof.ranks.rank_ray import ClusterUnreachableError, check_reachable

    asked: list[tuple[str, int]] = []

    def refused(where: tuple[str, int], timeout: float) -> socket.socket:
        asked.append(where)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", refused)
    if tried is None:
        check_reachable(address)
    else:
        with pytest.raises(ClusterUnreachableError, match=r"\(Connection refused\)"):
            check_reachable(address)
    assert asked == ([] if tried is None else [tried])


def test_a_port_out_of_range_is_one_line() -> None:
    from polyprof.ranks.rank_ray import ClusterUnreachableError, check_reachable

    with pytest.raises(ClusterUnreachableError, match=r"port 99999 is not a port \(1 to 65535\)"):
        check_reachable("ray://127.0.0.1:99999")


def test_the_address_is_checked_before_ray_is_imported(tmp_path: Path, monkeypatch) -> None:
    """Importing Ray takes seconds: the check's bound is the whole wait for a dead address."""
    from polyprof.ranks import rank_ray
    from polyprof.ranks.rank_set import collect_rank_set

    write_json(tmp_path / "run" / "r0.json", synthetic_rank(0, 1, [100.0]))
    rank_set = collect_rank_set([str(tmp_path / "run")], str(tmp_path / "pq"))

    def imported() -> Any:
        raise AssertionError("Ray was imported before the address was checked")

    monkeypatch.setattr(rank_ray, "ray_module", imported)
    monkeypatch.setattr(rank_ray, "_in_a_cluster", lambda: False)
    with pytest.raises(rank_ray.ClusterUnreachableError, match="no Ray cluster answers"):
        rank_ray.ray_rank_rows(rank_set, address=f"127.0.0.1:{closed_port()}")


@pytest.mark.slow  # starts a Ray cluster in this process (seconds)
def test_the_check_of_a_ray_address_lets_a_real_cluster_through() -> None:
    """The same check against a Ray GCS: it answers HTTP/2's greeting."""
    ray = pytest.importorskip("ray")
    from polyprof.ranks.rank_ray import check_reachable

    started = not ray.is_initialized()
    try:
        if started:
            ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        check_reachable(ray.get_runtime_context().gcs_address)
    finally:
        if started:
            ray.shutdown()


def test_a_second_ctrl_c_while_the_worker_stops_leaves_no_rank_running() -> None:
    """DuckDB drops an interrupt() when no query runs; a Ctrl-C landing meanwhile must not leave the
    worker to analyse every remaining rank (or run on under a closed connection)."""

    class Connection:
        interrupts = 0

        def interrupt(self) -> None:
            Connection.interrupts += 1
            if Connection.interrupts == 1:
                raise KeyboardInterrupt  # the second Ctrl-C, landing as the first is passed on

    ranks_begun: list[int] = []

    def each_rank(stop: threading.Event) -> str:
        for rank in range(40):
            if stop.is_set():
                raise KeyboardInterrupt
            ranks_begun.append(rank)
            time.sleep(0.05)  # a rank's work between queries, where interrupt() does nothing
        return "every rank"

    threading.Timer(0.2, _thread.interrupt_main).start()  # the first Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        rank_analysis.interruptible(Connection(), each_rank)
    assert Connection.interrupts >= 2
    assert len(ranks_begun) < 40
    assert not [t for t in threading.enumerate() if t.name.startswith("polyprof-duckdb")]


def test_an_unreachable_ray_address_is_said_before_any_trace_is_converted(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from polyprof import ranks

    run = tmp_path / "run"
    write_json(run / "r0.json", synthetic_rank(0, 1, [100.0]))

    def converted(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the traces were read before the address was checked")

    monkeypatch.setattr(ranks, "collect_rank_set", converted)
    address = f"127.0.0.1:{closed_port()}"
    assert cli_main(["report", str(run), "--engine", "ray", "--ray-address", address]) == 2
    assert f"no Ray cluster answers at --ray-address {address}" in capsys.readouterr().err
