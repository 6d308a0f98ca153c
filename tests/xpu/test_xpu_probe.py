"""The availability probe: every unavailable path gives a clear reason and the profiled process lives on.

Each probe runs in a child process (the plugin's own ``run_in_child``), so a
PTI abort kills only the child; the tests then check the finding in this
process, which proves it survived.
"""

from __future__ import annotations

import os

import pytest
from conftest import real_pti_lib_dir, real_pti_library, run_python, system_ze_loader
from polyprof_xpu import probe

needs_intel_pti = pytest.mark.skipif(real_pti_library() is None, reason="intel-pti is not installed")


def _has_zesinit(loader: str) -> bool:
    """Checked in a child: loading a Level Zero loader here would make the plugin think Level Zero started."""
    proc = run_python(f"import ctypes; print(hasattr(ctypes.CDLL({loader!r}), 'zesInit'))", {})
    return proc.stdout.strip() == "True"


def _probe() -> dict:
    probe.clear_cache()
    return probe.run_in_child()


def test_fakes_with_a_driver_and_two_gpus_are_available(fake_pti) -> None:
    finding = _probe()
    assert finding["available"] is True, finding
    assert finding["reason"] is None
    assert [d["index"] for d in finding["devices"]] == [0, 1]
    assert finding["devices"][1]["uuid"] == bytes([0x86, 0x80, 1] + [0] * 13).hex()
    assert finding["devices"][0]["name"] == "Fake Intel GPU 0"
    assert finding["pti_version"] == "1.2.0"


def test_no_driver_is_found_before_any_view_call(fake_pti, xpu_env) -> None:
    # FAKE_PTI_ABORT makes every view call abort, as real PTI does without a driver: the probe must stop first.
    xpu_env.setenv("FAKE_PTI_ABORT", "1")
    xpu_env.setenv("FAKE_ZE_INIT_RESULT", hex(0x78000001))
    finding = _probe()
    assert finding["code"] == "no_driver"
    assert "zeInit returned 0x78000001 (ZE_RESULT_ERROR_UNINITIALIZED)" in finding["reason"]


@pytest.mark.parametrize(
    ("env", "code", "text"),
    [
        ({"FAKE_ZE_DRIVERS": "0"}, "no_driver", "zeDriverGet found 0"),
        ({"FAKE_ZE_DEVICES": "0"}, "no_device", "no Intel GPU device"),
        ({"FAKE_PTI_NOT_IMPLEMENTED": "1"}, "pti_not_implemented", "PTI_ERROR_NOT_IMPLEMENTED (2)"),
        ({"FAKE_PTI_VERSION": "0.10.0"}, "old_pti", "Intel PTI 0.10.0 is too old"),
        ({"FAKE_PTI_REFUSE_KIND": "1"}, "pti_error", "ptiViewEnable returned PTI_ERROR_NOT_IMPLEMENTED (2)"),
    ],
)
def test_fake_unavailable_paths(fake_pti, xpu_env, env: dict, code: str, text: str) -> None:
    for k, v in env.items():
        xpu_env.setenv(k, v)
    finding = _probe()
    assert (finding["available"], finding["code"]) == (False, code), finding
    assert text in finding["reason"]


def test_abort_in_pti_kills_only_the_probe_child(fake_pti, xpu_env) -> None:
    xpu_env.setenv("FAKE_PTI_ABORT", "1")  # a driver is present, yet PTI aborts at the first view call
    finding = _probe()
    assert finding["code"] == "aborted"
    assert "signal 6" in finding["reason"] and "fake PTI: ptiViewSetCallbacks" in finding["reason"]


def test_loader_without_zesinit(fake_libs, fake_pti, xpu_env) -> None:
    xpu_env.setenv("POLYPROF_XPU_ZE_LOADER", fake_libs.ze_old_loader)
    finding = _probe()
    assert finding["code"] == "loader_without_zesinit"
    assert "has no zesInit" in finding["reason"] and "loader >= 1.9" in finding["reason"]


def test_bad_library_override_names_the_variable(xpu_env, tmp_path) -> None:
    xpu_env.setenv("POLYPROF_XPU_PTI_LIBRARY", str(tmp_path / "nope.so"))
    finding = _probe()
    assert finding["code"] == "no_pti"
    assert "POLYPROF_XPU_PTI_LIBRARY=" in finding["reason"] and "is not a file" in finding["reason"]


@needs_intel_pti
def test_real_pti_with_no_loader(xpu_env, tmp_path) -> None:
    xpu_env.setenv("POLYPROF_XPU_ZE_LOADER", str(tmp_path / "libze_loader.so.1"))
    finding = _probe()
    assert finding["code"] == "no_loader"
    assert finding["pti_version"] >= "0.11"
    assert finding["reason"].startswith("no Level Zero loader: cannot load")


@needs_intel_pti
def test_real_pti_with_this_machines_loader(xpu_env) -> None:
    """Whatever the machine has (no loader, Debian's libze1 1.8 without zesInit), a clear reason, no crash."""
    finding = _probe()
    assert finding["available"] is False
    loader = system_ze_loader()
    if loader is None:
        assert finding["code"] == "no_loader"
    else:
        has_zesinit = _has_zesinit(loader)
        assert finding["code"] in (
            ("no_driver", "venv_library_path", "pti_not_implemented")
            if has_zesinit
            else ("loader_without_zesinit",)
        ), finding
    assert finding["reason"]


@pytest.mark.skipif(system_ze_loader() is None, reason="no system Level Zero loader (apt-get install libze1)")
@needs_intel_pti
def test_real_pti_with_debian_libze1(xpu_env) -> None:
    loader = system_ze_loader()
    xpu_env.setenv("POLYPROF_XPU_ZE_LOADER", loader)
    finding = _probe()
    assert finding["available"] is False
    assert finding["ze_loader"] == os.path.realpath(loader) or finding["ze_loader"].startswith("/")
    if not _has_zesinit(loader):
        assert finding["code"] == "loader_without_zesinit"


@needs_intel_pti
def test_real_pti_in_a_venv_without_library_path(fake_libs, xpu_env) -> None:
    """xpu.md §0.4: pip's libxptifw.so is off the search path; the reason says LD_LIBRARY_PATH."""
    lib_dir = real_pti_lib_dir()
    if not any(n.startswith("libxptifw.so") for n in os.listdir(lib_dir)):
        pytest.skip("libxptifw.so is not next to libpti_view.so here")
    if lib_dir in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        pytest.skip("the library path already holds it")
    xpu_env.setenv("POLYPROF_XPU_ZE_LOADER", fake_libs.ze_loader)
    finding = _probe()
    assert finding["code"] == "venv_library_path"
    assert f"LD_LIBRARY_PATH={lib_dir}" in finding["reason"]


@needs_intel_pti
def test_real_pti_aborts_without_a_real_driver_but_only_the_child_dies(fake_libs, xpu_env) -> None:
    """The danger of xpu.md §0.2, for real: intel-pti's backend loaded, a loader that reports devices
    no real driver backs; PTI aborts at its first view call. Only the probe child dies."""
    xpu_env.setenv("POLYPROF_XPU_ZE_LOADER", fake_libs.ze_loader)
    xpu_env.setenv("LD_LIBRARY_PATH", f"{fake_libs.ze_dir}:{real_pti_lib_dir()}")
    finding = _probe()
    assert finding["available"] is False
    assert finding["code"] in ("aborted", "pti_error"), finding
    # With zeInit failing the probe stops before PTI is touched: no abort.
    xpu_env.setenv("FAKE_ZE_INIT_RESULT", hex(0x78000001))
    assert _probe()["code"] == "no_driver"


def test_in_process_probe_never_makes_view_calls(fake_pti, xpu_env) -> None:
    xpu_env.setenv("FAKE_PTI_ABORT", "1")
    proc = run_python(
        "from polyprof_xpu import probe; f = probe.check(view_calls=False); print(f['code'])",
        {k: os.environ[k] for k in ("POLYPROF_XPU_PTI_LIBRARY", "POLYPROF_XPU_ZE_LOADER", "FAKE_PTI_ABORT")},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_capabilities_report_the_reason(fake_pti, xpu_env) -> None:
    from polyprof.registry import make_plugin_manager

    xpu_env.setenv("FAKE_ZE_DEVICES", "0")
    pm = make_plugin_manager()
    info = {i.name: i for i in pm.plugin_infos()}["xpu"]
    assert info.status == "unavailable"
    assert "no Intel GPU device" in info.reason
    assert info.capabilities is not None and "XPU" in {a.name for a in info.capabilities.activities}
