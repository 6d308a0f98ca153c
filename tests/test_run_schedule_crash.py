"""``polyprof run --schedule``: profiler steps come after torch's ``Optimizer.step`` range closes.

Torch calls the global optimizer step post-hooks inside ``optimizer.step()``'s
``record_function("Optimizer.step#...")`` range. The whole-script profile used to stop and
restart torch's collector right there, and torch's collector then crashed the process now and
then (a segfault or an abort in ``disableProfiler``, most often when the run ended): about one
run in four with 6 steps and ``--schedule 0,0,2``, seven in eight with 30 steps. The steps now
happen when the optimizer's ``step()`` has returned, with the same step boundaries as before.
These tests run the CLI in subprocesses, a few at a time, and check the exit status and the
steps each written cycle holds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

TRAINING = """
    import torch

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range({steps}):
        optimizer.zero_grad()
        model(torch.randn(32, 64)).sum().backward()
        optimizer.step()
    print("TRAINED")
"""

MULTI = """
    import torch

    class MySGD(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    spare = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # SGD.step gets torch's wrapper too
    m1, m2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    o1 = MySGD(m1.parameters(), lr=0.1)
    o2 = torch.optim.Adam(m2.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(o1, 2)
    for _ in range(4):
        o1.zero_grad()
        o2.zero_grad()
        (m1(torch.randn(4, 8)).sum() + m2(torch.randn(4, 8)).sum()).backward()
        o1.step()  # two optimizer steps: MySGD's and, inside it, SGD's
        o2.step()
        scheduler.step()
    print("LR", round(o1.param_groups[0]["lr"], 6))
"""

#: Subprocesses at once: each spends most of its time importing torch.
AT_ONCE = 2


def start(cwd: Path, schedule: str, script: str, *options: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "polyprof", "run", *options),
            *("--schedule", schedule, "--output-dir", "out", script),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_many(
    tmp_path: Path, source: str, schedule: str, times: int, *options: str
) -> list[tuple[Path, int, str, str]]:
    """Run ``source`` under ``polyprof run --schedule`` ``times`` times, ``AT_ONCE`` at a time."""
    results = []
    for first in range(0, times, AT_ONCE):
        started = []
        for n in range(first, min(first + AT_ONCE, times)):
            cwd = tmp_path / f"run{n}"
            cwd.mkdir()
            (cwd / "train.py").write_text(textwrap.dedent(source))
            started.append((cwd, start(cwd, schedule, "train.py", *options)))
        for cwd, proc in started:
            out, err = proc.communicate(timeout=120)
            results.append((cwd, proc.returncode, out, err))
    return results


def cycles(cwd: Path, err: str) -> list[dict]:
    """Each written cycle's title and events, in the order the run wrote them."""
    titles = re.findall(r"^polyprof run: profile of train\.py, (cycle .+)$", err, flags=re.MULTILINE)
    paths = re.findall(r"^polyprof run: trace written to (.+)$", err, flags=re.MULTILINE)
    assert len(titles) == len(paths), err
    return [
        {"title": title, "events": json.loads((cwd / path).read_text())["traceEvents"]}
        for title, path in zip(titles, paths)
    ]


def profiler_steps(events: list[dict]) -> list[str]:
    return sorted(
        (e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")),
        key=lambda name: int(name.rpartition("#")[2]),
    )


def step_holding(events: list[dict], event: dict) -> str | None:
    """The ``ProfilerStep#N`` whose range holds ``event``'s, if one does."""
    for step in events:
        if step.get("name", "").startswith("ProfilerStep#") and (
            step["ts"] <= event["ts"] and event["ts"] + event["dur"] <= step["ts"] + step["dur"]
        ):
            return step["name"]
    return None


def test_schedule_steps_after_the_optimizer_step_range_never_crash(tmp_path: Path) -> None:
    # 30 steps, a cycle every 2: 15 stops and restarts of torch's collector. Before the fix 7 runs
    # in 8 crashed, so 6 runs without a crash leave well under a one-in-a-million chance to miss it.
    for cwd, code, out, err in run_many(tmp_path, TRAINING.format(steps=30), "0,0,2", 6):
        assert code == 0, f"exit status {code}\n{err[-3000:]}"
        assert out.splitlines() == ["TRAINED"]
        written = cycles(cwd, err)
        # The same cycles and steps as before the fix: cycle k holds steps 2k-2 and 2k-1 and ends
        # after 2k optimizer steps; the run's end cuts cycle 16 short in step 30.
        assert [c["title"] for c in written] == [
            f"cycle {k} (after {min(2 * k, 30)} optimizer steps)" for k in range(1, 17)
        ]
        for k, cycle in enumerate(written[:15], start=1):
            events = cycle["events"]
            assert profiler_steps(events) == [f"ProfilerStep#{2 * k - 2}", f"ProfilerStep#{2 * k - 1}"]
            # Each optimizer.step() now ends inside its own profiler step (it used to outlast it).
            ranges = sorted(
                (e for e in events if e.get("name") == "Optimizer.step#SGD.step"), key=lambda e: e["ts"]
            )
            assert [step_holding(events, e) for e in ranges] == profiler_steps(events)
        assert profiler_steps(written[15]["events"]) == ["ProfilerStep#30"]


def test_schedule_counts_every_torch_wrapped_step_of_every_optimizer(tmp_path: Path) -> None:
    """Two optimizers, a subclass whose ``step`` calls ``super().step()``, an LR scheduler.

    One profiler step per optimizer step post-hook, as before: ``o1.step()`` is two (MySGD's and
    SGD's, both wrapped by torch), ``o2.step()`` one, so three per iteration.
    """
    [(cwd, code, out, err)] = run_many(tmp_path, MULTI, "0,0,3", 1)
    assert code == 0, err[-3000:]
    assert out.splitlines() == ["LR 0.001"]  # the scheduler saw every step
    assert "lr_scheduler.step()" not in err  # torch's warning of a scheduler stepped before its optimizer
    written = cycles(cwd, err)
    assert [c["title"] for c in written] == [
        "cycle 1 (after 3 optimizer steps)",
        "cycle 2 (after 6 optimizer steps)",
        "cycle 3 (after 9 optimizer steps)",
        "cycle 4 (after 12 optimizer steps)",
        "cycle 5 (after 12 optimizer steps)",
    ]
    for k, cycle in enumerate(written[:4]):
        assert profiler_steps(cycle["events"]) == [f"ProfilerStep#{n}" for n in range(3 * k, 3 * k + 3)]
    assert profiler_steps(written[4]["events"]) == ["ProfilerStep#12"]


def test_with_stack_keeps_the_frames_of_the_optimizers_step(tmp_path: Path) -> None:
    """The step wrapper is polyprof's code; what it calls (torch's and the user's step) is not."""
    [(cwd, code, _, err)] = run_many(tmp_path, TRAINING.format(steps=4), "0,0,2", 1, "--with-stack")
    assert code == 0, err[-3000:]
    for cycle in cycles(cwd, err)[:2]:
        frames = {e["name"] for e in cycle["events"] if e.get("cat") == "python_function"}
        assert any(re.search(r"optim/sgd\.py\(\d+\): step$", name) for name in frames), sorted(frames)
        assert not any("whole_script.py" in name for name in frames), sorted(frames)
