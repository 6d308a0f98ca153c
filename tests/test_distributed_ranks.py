"""Rank-aware recording under a real ``torchrun --nproc_per_node 2`` job on the gloo backend.

Each rank runs one training step with an all-reduce of its gradients, profiled by polyprof and then
by torch.profiler; torch's trace of the same rank is the oracle for ``distributedInfo``. A second job
runs the step under ``polyprof run``. Names of the per-rank files and the units in them are checked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polyprof.base.distributed import RankOfProcess, default_worker_name, rank_of_process, rank_of_trace

pytest.importorskip("torch")

STEP = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Linear(8, 4)

    def step():
        model(torch.randn(16, 8)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
    """
)

PROFILED_BY_BOTH = STEP + textwrap.dedent(
    """
    import polyprof
    from torch.profiler import profile as torch_profile, tensorboard_trace_handler as torch_handler

    out = sys.argv[1]
    step()  # the gloo connections are made outside both profiles
    with polyprof.profile(on_trace_ready=polyprof.tensorboard_trace_handler(os.path.join(out, "polyprof"))):
        step()
    with torch_profile(on_trace_ready=torch_handler(os.path.join(out, "torch"))):
        step()
    dist.barrier()
    dist.destroy_process_group()
    """
)

UNDER_POLYPROF_RUN = STEP + textwrap.dedent(
    """
    step()
    dist.destroy_process_group()
    """
)


def torchrun(tmp_path: Path, *args: str) -> None:
    """Two local ranks of ``args`` (a script or ``-m module ...``) under torch's launcher.

    ``--standalone``: the launcher binds its own free port, so no other process can take it first.
    Its own session, so a timeout kills the ranks too, not only the launcher.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = launcher.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()
        raise
    assert launcher.returncode == 0, stderr[-4000:]


def traces(folder: Path) -> dict[int, tuple[str, dict]]:
    """rank -> (file name, trace) of every trace in ``folder``, one per rank."""
    found: dict[int, tuple[str, dict]] = {}
    for path in sorted(folder.iterdir()):
        doc = json.loads(path.read_text())
        rank = doc["distributedInfo"]["rank"]
        assert rank not in found, f"two traces of rank {rank}: {found[rank][0]}, {path.name}"
        found[rank] = (path.name, doc)
    return found


@pytest.mark.slow
def test_each_rank_of_a_torchrun_job_writes_torchs_distributed_info_in_a_file_named_by_rank(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(PROFILED_BY_BOTH)
    torchrun(tmp_path, str(script), str(tmp_path))
    ours, theirs = traces(tmp_path / "polyprof"), traces(tmp_path / "torch")
    assert sorted(ours) == sorted(theirs) == [0, 1]
    for rank in (0, 1):
        name, doc = ours[rank]
        assert re.fullmatch(rf"rank{rank}_{re.escape(socket.gethostname())}_\d+\.\d+\.pt\.trace\.json", name)
        info = doc["distributedInfo"]
        assert info == theirs[rank][1]["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", rank, 2)
        names = {event.get("name") for event in doc["traceEvents"]}
        collective = [n for n in map(str, names) if "all_reduce" in n or "allreduce" in n]
        assert collective, sorted(map(str, names))[:40]


@pytest.mark.slow
def test_polyprof_run_under_torchrun_names_each_ranks_trace_by_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(UNDER_POLYPROF_RUN)
    torchrun(tmp_path, "-m", "polyprof", "run", "--output-dir", str(tmp_path / "out"), str(script))
    written = traces(tmp_path / "out")
    assert sorted(written) == [0, 1]
    for rank, (name, doc) in written.items():
        assert name.startswith(f"train.rank{rank}_{socket.gethostname()}_"), name
        assert doc["distributedInfo"]["world_size"] == 2


@pytest.mark.parametrize(
    ("rank", "world_size", "label"),
    [
        (0, 1, "rank0"),
        (3, 8, "rank3"),
        (7, 10, "rank7"),
        (10, 11, "rank10"),
        (5, 100, "rank05"),
        (0, 1000, "rank000"),
    ],
)
def test_rank_labels_are_zero_padded_to_the_world_size(rank: int, world_size: int, label: str) -> None:
    assert RankOfProcess(rank=rank, world_size=world_size).label == label


def test_the_launchers_rank_names_files_before_a_process_group_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "12")
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert rank_of_process() == RankOfProcess(rank=12, world_size=16)
    assert default_worker_name("host", 42) == "rank12_host_42"
    for rank, world_size in (("16", "16"), ("-1", "4"), ("x", "4")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world_size)
        assert default_worker_name("host", 42) == "host_42"  # no sensible rank: torch's name
    monkeypatch.delenv("RANK")
    assert rank_of_process() is None


@pytest.mark.slow
def test_polyprof_run_notes_the_group_whichever_way_the_script_destroys_it_and_puts_torchs_back(
    tmp_path: Path,
) -> None:
    """One in-process gloo rank (no launcher): destroyed with a positional None, the default group."""
    script = tmp_path / "one_rank.py"
    script.write_text(
        textwrap.dedent(
            """
            import atexit
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            torch.ones(4).sum()
            dist.destroy_process_group(None)
            # after polyprof run has finished: torch's function is back
            original = dist.distributed_c10d.destroy_process_group
            atexit.register(lambda: print("restored:", dist.destroy_process_group is original))
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-m", "polyprof", "run", "--output-dir", str(tmp_path / "out"), str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restored: True" in done.stdout
    ((name, doc),) = traces(tmp_path / "out").values()
    assert doc["distributedInfo"]["backend"] == "gloo" and doc["distributedInfo"]["world_size"] == 1
    # no launcher set RANK and the group was gone when the file was named: the trace's rank names it
    assert name.startswith(f"one_rank.rank0_{socket.gethostname()}_"), name


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"distributedInfo": '{"backend": "nccl", "rank": 5, "world_size": 16}'}, RankOfProcess(5, 16)),
        ({"distributedInfo": '{"rank": 16, "world_size": 16}'}, None),
        ({"distributedInfo": "not json"}, None),
        ({"distributedInfo": '{"rank": "5", "world_size": 16}'}, None),
        ({}, None),
    ],
)
def test_a_traces_rank_names_its_file(metadata: dict[str, str], expected, monkeypatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert rank_of_trace(metadata) == expected
    name = default_worker_name("host", 7, rank_of_trace(metadata))
    assert name == ("host_7" if expected is None else f"{expected.label}_host_7")
