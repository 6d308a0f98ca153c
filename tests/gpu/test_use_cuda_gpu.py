"""``use_cuda`` of the legacy and autograd profilers on a real GPU (docs/shims.md, "CUDA time").

Under the shims, ``torch.autograd.profiler.profile(use_device="cuda")`` (torch's GPU fallback
when ``use_kineto`` is false) and ``torch.autograd.profiler_legacy.profile(use_cuda=True)``
(torch's legacy CUDA events) record what torch records with ``use_kineto=True``: the real
kernels. One child process runs torch's three ways and polyprof's three spellings.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU that torch can use (CUDA)"),
]

CHILD = r"""
import collections, json
import torch
from torch.autograd import profiler as ap, profiler_legacy
import polyprof.shim

x = torch.randn(1024, 1024, device="cuda")


def step():
    for _ in range(10):
        (x @ x).relu_().sum()
    torch.cuda.synchronize()


step()
out = {}


def run(name, make):
    with make() as prof:
        step()
    events = list(prof.function_events)
    host = [e for e in events if int(e.device_type) == 0]
    mm = [e for e in host if e.name == "aten::mm"]
    out[name] = {
        "ops": collections.Counter(e.name for e in host if e.name.startswith("aten::")),
        "device_rows": collections.Counter(e.name for e in events if int(e.device_type) != 0),
        "mm_kernel_names": sorted({k.name for e in mm for k in e.kernels}),
        "mm_legacy": sorted({bool(e.is_legacy) for e in mm}),
        "mm_self_cuda_us": sum(e.self_device_time_total for e in mm),
    }


run("torch fallback", lambda: ap.profile(use_device="cuda"))
run("torch kineto", lambda: ap.profile(use_device="cuda", use_kineto=True))
run("torch legacy", lambda: profiler_legacy.profile(use_cuda=True))
with polyprof.shim.shimmed():
    run("polyprof autograd", lambda: ap.profile(use_device="cuda"))
    run("polyprof autograd kineto", lambda: ap.profile(use_device="cuda", use_kineto=True))
    run("polyprof legacy", lambda: profiler_legacy.profile(use_cuda=True))
print("RESULT " + json.dumps(out))
"""


def test_use_cuda_records_torchs_kineto_kernels_not_its_fallback(record_result):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, check=False
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, f"exit status {proc.returncode}\n{proc.stderr[-4000:]}"
    out = json.loads(line[len("RESULT ") :])
    record_result(
        {
            "record": "use_cuda",
            **{
                name: {k: v[k] for k in ("mm_kernel_names", "mm_self_cuda_us", "ops")}
                for name, v in out.items()
            },
        }
    )
    fallback, kineto, legacy = out["torch fallback"], out["torch kineto"], out["torch legacy"]
    # torch's fallback and legacy profiler: one "kernel" per op, named after it; no device rows
    assert fallback["mm_kernel_names"] == ["aten::mm"] and fallback["mm_legacy"] == [True]
    assert fallback["device_rows"] == {} and legacy["device_rows"] == {}
    assert legacy["mm_kernel_names"] == ["aten::mm"]
    # torch with use_kineto=True: the real kernels
    assert kineto["device_rows"] and "aten::mm" not in kineto["mm_kernel_names"]
    for name in ("polyprof autograd", "polyprof autograd kineto", "polyprof legacy"):
        ours = out[name]
        assert ours["device_rows"] == kineto["device_rows"], name
        assert ours["mm_kernel_names"] == kineto["mm_kernel_names"], name
        assert ours["mm_legacy"] == [False], name
        assert ours["mm_self_cuda_us"] == pytest.approx(kineto["mm_self_cuda_us"], rel=0.1), name
    # The ops are torch's with use_kineto=True. torch's fallback differs from those by a second,
    # nested aten::sum per call (an H200 with torch 2.11: 20 rows for 10 sums), which its legacy
    # profiler and Kineto do not show.
    assert out["polyprof autograd"]["ops"] == kineto["ops"]
    assert out["polyprof autograd kineto"]["ops"] == kineto["ops"]
    assert out["polyprof legacy"]["ops"] == legacy["ops"] == kineto["ops"]
