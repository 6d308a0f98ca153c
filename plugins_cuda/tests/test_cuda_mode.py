"""How polyprof-cuda records CUDA: torch's Kineto in every CUDA build of torch, else not at all."""

from __future__ import annotations

import pytest

from polyprof.base import torch_support
from polyprof_cuda import mode

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


def _no_cupti_wheel(cuda: str) -> str | None:
    return None


def _never(cuda: str) -> str | None:
    raise AssertionError("no CUPTI version is looked up without a CUDA build of torch")


def test_a_cuda_build_of_torch_means_kineto_with_the_cupti_version_when_known() -> None:
    build = torch_support.parse_version_file(CUDA_VERSION_PY)
    assert build == torch_support.TorchBuild("2.11.0+cu130", cuda="13.0")
    assert mode.choose_mode(build, lambda cuda: "13.0.85") == mode.CudaMode(
        "kineto", "via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0, CUPTI 13.0.85)"
    )
    assert mode.choose_mode(build, _no_cupti_wheel) == mode.CudaMode(
        "kineto", "via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0)"
    )


def test_a_cpu_build_of_torch_means_cuda_is_unavailable_and_says_how_to_fix_it() -> None:
    build = torch_support.parse_version_file(CPU_VERSION_PY)
    assert build == torch_support.TorchBuild("2.13.0+cpu")
    chosen = mode.choose_mode(build, _never)
    assert chosen.kind is None
    assert chosen.detail.startswith(
        "torch 2.13.0+cpu is not a CUDA build: torch's Kineto cannot record CUDA here"
    )
    assert "install a CUDA build of torch" in chosen.detail and "docs/cuda.md" in chosen.detail


def test_without_torch_cuda_is_unavailable() -> None:
    chosen = mode.choose_mode(None, _never)
    assert chosen.kind is None
    assert chosen.detail.startswith("torch is not installed")
    assert "install a CUDA build of torch" in chosen.detail


@pytest.mark.parametrize(
    ("cuda", "installed", "expected"),
    [
        ("13.0", {"nvidia-cuda-cupti": "13.0.85"}, "13.0.85"),  # torch cu130's pin
        ("12.8", {"nvidia-cuda-cupti-cu12": "12.8.90"}, "12.8.90"),  # torch cu128's pin
        ("11.8", {"nvidia-cuda-cupti-cu11": "11.8.87"}, "11.8.87"),
        # a CUPTI wheel of another CUDA major is not the one torch loads
        ("12.8", {"nvidia-cuda-cupti": "13.0.85"}, None),
        ("12.8", {"nvidia-cuda-cupti": "13.0.85", "nvidia-cuda-cupti-cu12": "12.8.90"}, "12.8.90"),
        ("13.0", {}, None),  # CUPTI from a toolkit or conda: no wheel to read
    ],
)
def test_the_cupti_version_is_read_from_the_wheel_torch_pins(cuda, installed, expected) -> None:
    assert mode.installed_cupti_version(cuda, installed.get) == expected


def test_current_mode_reads_the_installed_build_and_the_cupti_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    build = torch_support.TorchBuild("2.11.0+cu130", cuda="13.0")
    monkeypatch.setattr(torch_support, "installed_build", lambda: build)
    monkeypatch.setattr(mode, "installed_cupti_version", lambda cuda: "13.0.85" if cuda == "13.0" else None)
    assert mode.current_mode().detail == "via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0, CUPTI 13.0.85)"
    monkeypatch.setattr(torch_support, "installed_build", lambda: None)
    assert mode.current_mode().kind == "kineto"  # cached for the process
    mode.forget_cached_mode()
    assert mode.current_mode().kind is None


def test_the_installed_torch_is_read_as_torch_reports_itself() -> None:
    torch = pytest.importorskip("torch")
    build = torch_support.installed_build()
    assert (build.version, build.cuda) == (str(torch.__version__), torch.version.cuda)


def test_deciding_imports_neither_torch_nor_cupti() -> None:
    """In a fresh interpreter: ``polyprof plugins`` must not pay torch's import to show the mode."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from polyprof_cuda import plugin\n"
        "caps = plugin.polyprof_capabilities()\n"
        "print(json.dumps([caps.mode or caps.unavailable_reason,"
        " [m for m in ('torch', 'cupti', 'pynvml') if m in sys.modules]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    detail, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported == []
    assert detail == mode.choose_mode(torch_support.installed_build(), mode.installed_cupti_version).detail


# ------------------------------------------------------- without torch: provisional


@pytest.mark.parametrize(
    ("environ", "files", "libcuda", "reason"),
    [
        ({}, {"/proc/driver/nvidia/version"}, None, None),
        ({}, {"/dev/nvidiactl"}, None, None),
        ({}, set(), "libcuda.so.1", None),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, {"/dev/nvidiactl"}, None, None),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8e6d"}, {"/dev/nvidiactl"}, None, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, {"/dev/nvidiactl"}, None, "CUDA_VISIBLE_DEVICES='' hides every GPU"),
        (
            {"CUDA_VISIBLE_DEVICES": "-1"},
            {"/dev/nvidiactl"},
            None,
            "CUDA_VISIBLE_DEVICES='-1' hides every GPU",
        ),
        (
            {"CUDA_VISIBLE_DEVICES": "NoDevFiles"},
            {"/dev/nvidiactl"},
            None,
            "CUDA_VISIBLE_DEVICES='NoDevFiles' hides every GPU",
        ),
        (
            {},
            set(),
            None,
            (
                "no NVIDIA driver found (neither /proc/driver/nvidia/version nor /dev/nvidiactl exists, "
                "and no libcuda)"
            ),
        ),
    ],
)
def test_the_driver_and_the_visible_devices_answer_without_torch(environ, files, libcuda, reason) -> None:
    assert mode.driver_reason(environ, files.__contains__, lambda name: libcuda) == reason


def test_without_torch_loaded_the_answer_is_provisional(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from polyprof_cuda import plugin

    monkeypatch.setattr(mode, "current_mode", lambda: mode.CudaMode(mode.KINETO, "via torch's Kineto (test)"))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(mode, "driver_reason", lambda: None)
    caps = plugin.polyprof_capabilities()
    assert (caps.unavailable_reason, caps.mode) == (None, "via torch's Kineto (test)")
    assert caps.provisional == "whether torch sees a GPU (torch.cuda.is_available())"
    monkeypatch.setattr(mode, "driver_reason", lambda: "no NVIDIA driver found")
    caps = plugin.polyprof_capabilities()
    assert (caps.unavailable_reason, caps.provisional) == (
        "no NVIDIA driver found",
        "whether torch sees a GPU (torch.cuda.is_available())",
    )
