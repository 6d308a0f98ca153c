"""Which way polyprof-cuda records CUDA: torch's Kineto in every CUDA build of torch, else direct CUPTI."""

from __future__ import annotations

import sys

import pytest
from polyprof import torch_support
from polyprof_cuda import mode, probe
from polyprof_cuda.cupti_api import CuptiApi

CUDA_VERSION_PY = """__version__ = '2.11.0+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = 'abc'
hip: Optional[str] = None
xpu: Optional[str] = None
"""
CPU_VERSION_PY = """__version__ = '2.13.0+cpu'
cuda: Optional[str] = None
hip: Optional[str] = None
"""


def _never() -> str | None:
    raise AssertionError("a CUDA build of torch must not be probed for direct CUPTI")


def test_a_cuda_build_of_torch_means_kineto_and_no_cupti_probe() -> None:
    build = torch_support.parse_version_file(CUDA_VERSION_PY)
    assert build == torch_support.TorchBuild("2.11.0+cu130", cuda="13.0")
    chosen = mode.choose_mode(build, _never)
    assert chosen == mode.CudaMode("kineto", "via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0)")


def test_a_cpu_build_or_no_torch_means_direct_cupti_where_it_can_run() -> None:
    build = torch_support.parse_version_file(CPU_VERSION_PY)
    assert build == torch_support.TorchBuild("2.13.0+cpu")
    assert mode.choose_mode(build, lambda: None) == mode.CudaMode(
        "direct", "direct CUPTI (torch 2.13.0+cpu is not a CUDA build)"
    )
    assert mode.choose_mode(None, lambda: None).detail == "direct CUPTI (torch is not installed)"
    assert mode.choose_mode(build, lambda: "no NVIDIA driver") == mode.CudaMode(None, "no NVIDIA driver")


def test_the_installed_torch_is_read_as_torch_reports_itself() -> None:
    torch = pytest.importorskip("torch")
    build = torch_support.installed_build()
    assert (build.version, build.cuda) == (str(torch.__version__), torch.version.cuda)


def test_the_cupti_probe_runs_in_a_child_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What loads libcupti or initialises CUDA never runs in the user's process."""
    api = CuptiApi()
    monkeypatch.setattr(api, "binding_installed", lambda: True)
    monkeypatch.setattr(api, "driver_present", lambda: True)
    had_cupti = "cupti" in sys.modules
    reason = probe._probe_here_then_in_child(api)
    assert isinstance(reason, str) and reason  # no GPU here: the child says why
    assert ("cupti" in sys.modules) == had_cupti
