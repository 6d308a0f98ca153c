"""ZE_ENABLE_TRACING_LAYER and IPEX_ZE_TRACING, exactly as docs/xpu.md describes them."""

from __future__ import annotations

import pytest

from polyprof_xpu import env


@pytest.fixture
def not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "level_zero_started", lambda: False)


@pytest.mark.parametrize(
    ("given", "layer", "set_by_plugin"),
    [
        ({}, "1", True),
        ({"ZE_ENABLE_TRACING_LAYER": "0"}, "0", False),  # the user's choice stands
        ({"ZE_ENABLE_TRACING_LAYER": "1"}, "1", False),
        ({"IPEX_ZE_TRACING": "1"}, "1", True),
        ({"IPEX_ZE_TRACING": "1", "ZE_ENABLE_TRACING_LAYER": "0"}, "1", True),  # as IPEX's setenv(..., 1)
        ({"IPEX_ZE_TRACING": ""}, "1", True),
    ],
)
def test_tracing_layer_rules(not_started, given: dict, layer: str, set_by_plugin: bool) -> None:
    environ = dict(given)
    result = env.configure(environ)
    assert result.disabled_reason is None
    assert environ.get("ZE_ENABLE_TRACING_LAYER") == layer == result.tracing_layer
    assert result.set_by_plugin is set_by_plugin and result.too_late is False


def test_ipex_ze_tracing_0_disables_and_touches_nothing(not_started) -> None:
    environ = {"IPEX_ZE_TRACING": "0"}
    result = env.configure(environ)
    assert result.disabled_reason == "XPU tracing is turned off by IPEX_ZE_TRACING=0 in the environment"
    assert "ZE_ENABLE_TRACING_LAYER" not in environ


def test_bad_ipex_value_names_the_choices(not_started) -> None:
    result = env.configure({"IPEX_ZE_TRACING": "yes"})
    assert (
        result.disabled_reason
        == "IPEX_ZE_TRACING='yes' is not valid; use 1 (trace XPU), 0 (do not) or leave it unset"
    )


def test_too_late_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "level_zero_started", lambda: True)
    environ: dict[str, str] = {}
    with pytest.warns(env.TracingLayerTooLateWarning, match="Level Zero is already running"):
        result = env.configure(environ)
    assert result.too_late and environ["ZE_ENABLE_TRACING_LAYER"] == "1"


def test_loading_the_plugin_sets_the_layer_in_a_fresh_process(run_python) -> None:
    proc = run_python(
        "import os, warnings; warnings.simplefilter('error');"
        "import polyprof_xpu.plugin as p;"
        "print(os.environ.get('ZE_ENABLE_TRACING_LAYER'), p.TRACING_ENVIRONMENT.too_late)",
        {},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "False"]


def test_loading_after_level_zero_started_warns_in_a_fresh_process(tmp_path, run_python) -> None:
    """A file mapped under the loader's name is what /proc/self/maps shows once Level Zero has loaded."""
    loader = tmp_path / "libze_loader.so.1"
    loader.write_bytes(b"\0" * 4096)
    proc = run_python(
        f"import mmap; f = open({str(loader)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ);"
        "import warnings; warnings.simplefilter('always');"
        "import polyprof_xpu.plugin as p; print(p.TRACING_ENVIRONMENT.too_late)",
        {},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    assert "TracingLayerTooLateWarning" in proc.stderr
