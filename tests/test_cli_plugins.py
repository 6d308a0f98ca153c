"""``polyprof plugins`` and ``polyprof plugins --json``: in-process and as a real command.

In-process runs use fake distributions; subprocess runs install a real (tiny)
``.dist-info`` on ``PYTHONPATH``, which ``importlib.metadata`` discovers the way
it discovers anything pip installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polyprof import __version__
from polyprof.cli import build_parser, format_plugin_table, main
from polyprof.hooks.components import Capabilities
from polyprof.hooks.plugin_discovery import ALLOW_LIST_ENV, BUILTIN_PLUGINS, DISABLE_AUTOLOAD_ENV
from polyprof.hooks.plugin_info import PluginInfo
from polyprof.hooks.registry import TRACE_ENV

GOOD_PLUGIN = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(activities=["hpu"], exporters=("cli_fake",), aggregators=("cli_agg",))
"""
BROKEN_PLUGIN = """
    raise ImportError("libclifake.so: cannot open shared object file")
"""
SHY_PLUGIN = """
    from polyprof.base.errors import PluginUnavailable
    raise PluginUnavailable("no CliFake device present")
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    """A directory holding plugin modules and a distribution's metadata, as pip would leave them."""
    root = tmp_path_factory.mktemp("site")
    for module, source in (
        ("pp_cli_good", GOOD_PLUGIN),
        ("pp_cli_broken", BROKEN_PLUGIN),
        ("pp_cli_shy", SHY_PLUGIN),
    ):
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    dist_info = root / "polyprof_cli_fake-2.0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: polyprof-cli-fake\nVersion: 2.0.1\n")
    (dist_info / "entry_points.txt").write_text(
        "[polyprof]\ncli_good = pp_cli_good\ncli_broken = pp_cli_broken\ncli_shy = pp_cli_shy\n"
    )
    return root


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (DISABLE_AUTOLOAD_ENV, ALLOW_LIST_ENV, TRACE_ENV):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_site(monkeypatch, site_dir):
    """Only the fake distribution is installed (plus the core's built-ins by module path)."""
    monkeypatch.syspath_prepend(str(site_dir))
    dists = list(importlib.metadata.distributions(path=[str(site_dir)]))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(dists))
    yield site_dir
    for module in ("pp_cli_good", "pp_cli_broken", "pp_cli_shy"):
        sys.modules.pop(module, None)


def subprocess_env(site_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """Parse ``polyprof plugins`` output: name -> {column: cell}, wrapped cells joined."""
    lines = text.splitlines()
    header = lines[0]
    titles = header.split()
    starts = [header.index(title) for title in titles]
    rows: list[dict[str, str]] = []
    for line in lines[1:]:
        if not line.strip():
            break  # the summary follows the blank line
        cells = [line[start:end].strip() for start, end in zip(starts, [*starts[1:], None], strict=True)]
        if cells[0]:
            rows.append(dict(zip(titles, cells, strict=True)))
        else:  # a continuation line of wrapped cells
            for title, cell in zip(titles, cells, strict=True):
                if cell:
                    rows[-1][title] = f"{rows[-1][title]} {cell}"
    return {row["NAME"]: row for row in rows}


# -------------------------------------------------------------------- in-process


def test_plugins_table(fake_site, capsys):
    assert main(["plugins"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROVIDES"]
    rows = table_rows(out)
    assert rows["cli_good"] == {
        "NAME": "cli_good",
        "DISTRIBUTION": "polyprof-cli-fake",
        "VERSION": "2.0.1",
        "STATUS": "loaded",
        "PROVIDES": "activities: HPU; exporters: cli_fake; aggregators: cli_agg",
    }
    assert rows["cli_broken"]["STATUS"] == (
        "failed: ImportError: libclifake.so: cannot open shared object file"
    )
    assert rows["cli_broken"]["PROVIDES"] == "-"
    assert rows["cli_shy"]["STATUS"] == "unavailable: no CliFake device present"
    for name in BUILTIN_PLUGINS:
        assert rows[name]["DISTRIBUTION"] == "polyprof" and rows[name]["VERSION"] == __version__
    [summary] = [line for line in lines if line.startswith(f"{len(rows)} plugins: ")]
    assert "1 unavailable" in summary
    n_loaded = sum(row["STATUS"].startswith("loaded") for row in rows.values())
    assert f"{n_loaded} loaded" in summary
    assert "polyprof plugins --tracebacks" in out
    # The table is the output; the load failures are not repeated as log lines.
    assert "plugin_load_failed" not in err


def test_plugins_tracebacks(fake_site, capsys):
    assert main(["plugins", "--tracebacks"]) == 0
    out = capsys.readouterr().out
    assert "--- cli_broken (pp_cli_broken) ---" in out
    assert "pp_cli_broken.py" in out and "ImportError: libclifake.so" in out


def test_plugins_json(fake_site, capsys):
    assert main(["plugins", "--json"]) == 0
    out, _ = capsys.readouterr()
    records = {r["name"]: r for r in json.loads(out)}  # stdout holds nothing but the JSON
    assert set(BUILTIN_PLUGINS) <= set(records)
    good = records["cli_good"]
    assert good["status"] == "loaded" and good["reason"] is None
    assert good["distribution"] == "polyprof-cli-fake" and good["version"] == "2.0.1"
    assert good["module"] == "pp_cli_good" and good["builtin"] is False
    assert good["capabilities"] == {
        "activities": ["HPU"],
        "exporters": ["cli_fake"],
        "aggregators": ["cli_agg"],
        "unavailable_reason": None,
        "mode": None,
        "provisional": None,
    }
    assert good["hooks"] == ["polyprof_capabilities"]
    broken = records["cli_broken"]
    assert broken["status"] == "failed" and broken["capabilities"] is None
    assert "raise ImportError" in broken["traceback"]
    assert records["cli_shy"]["display_status"] == "unavailable: no CliFake device present"
    for name in BUILTIN_PLUGINS:
        assert records[name]["builtin"] is True and records[name]["version"] == __version__


def test_plugins_respects_opt_outs(fake_site, capsys, monkeypatch):
    monkeypatch.setenv(ALLOW_LIST_ENV, "cli_shy")
    assert main(["plugins", "--json"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert records["cli_good"]["status"] == "blocked"
    assert records["cli_good"]["reason"] == "not in POLYPROF_PLUGINS (cli_shy)"
    assert records["cli_shy"]["status"] == "unavailable"


def test_usage_errors_version_and_help(capsys):
    assert main([]) == 2
    assert "plugins" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"polyprof {__version__}"
    assert main(["plugins", "--help"]) == 0
    assert "--json" in capsys.readouterr().out


def test_parser_has_room_for_more_subcommands():
    parser = build_parser()
    args = parser.parse_args(["-v", "plugins", "--json"])
    assert args.verbose == 1 and args.json and callable(args.handler)


def test_table_wraps_long_cells_and_names_code_plugins():
    long_reason = "ModuleNotFoundError: No module named 'some_vendor_sdk_with_a_long_name' " * 2
    infos = [
        PluginInfo("short", "mod", None, None, "loaded", capabilities=Capabilities(exporters=("x",))),
        PluginInfo("long", "mod2", "dist-long", "1.0", "failed", reason=long_reason),
    ]
    text = format_plugin_table(infos)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["short", "(in", "code)", "-"]
    assert max(len(line) for line in lines) < 140
    long_lines = [line for line in lines if "some_vendor" in line or "ModuleNotFound" in line]
    assert len(long_lines) >= 2, "a long status wraps onto more lines"
    assert lines[-1] == "2 plugins: 1 loaded, 1 failed"


# -------------------------------------------------------------------- subprocess


def run_polyprof(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polyprof", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.slow
def test_python_m_polyprof_plugins_json_discovers_installed_distribution(site_dir, tmp_path):
    result = run_polyprof(["plugins", "--json"], subprocess_env(site_dir), tmp_path)
    assert result.returncode == 0, result.stderr
    records = {r["name"]: r for r in json.loads(result.stdout)}
    assert records["cli_good"]["status"] == "loaded"
    assert records["cli_good"]["distribution"] == "polyprof-cli-fake"
    assert records["cli_broken"]["status"] == "failed"
    assert records["cli_shy"]["status"] == "unavailable"
    assert set(BUILTIN_PLUGINS) <= set(records)


@pytest.mark.slow
def test_python_m_polyprof_plugins_table_autoload_off_and_tracing(site_dir, tmp_path):
    env = subprocess_env(site_dir, **{DISABLE_AUTOLOAD_ENV: "1", TRACE_ENV: "1"})
    result = run_polyprof(["plugins"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert rows["cli_good"]["STATUS"] == (
        "blocked: autoload is off (POLYPROF_DISABLE_PLUGIN_AUTOLOAD=1) "
        "and it is not named in POLYPROF_PLUGINS"
    )
    assert set(BUILTIN_PLUGINS) <= set(rows)
    # Hook-call tracing goes to stderr, through logging; stdout holds only the table.
    assert "event='hook_call'" in result.stderr
    assert "hook_call" not in result.stdout


@pytest.mark.slow
def test_console_script(site_dir, tmp_path):
    script = Path(sys.executable).parent / "polyprof"
    if not script.exists():
        pytest.skip("the polyprof console script is not installed next to this interpreter")
    result = subprocess.run(
        [str(script), "plugins", "--json"],
        capture_output=True,
        text=True,
        env=subprocess_env(site_dir),
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "cli_good" in {r["name"] for r in json.loads(result.stdout)}


def test_a_plugin_mode_is_shown_next_to_loaded() -> None:
    from polyprof.base.activity import ProfilerActivity
    from polyprof.hooks.components import Capabilities
    from polyprof.hooks.plugin_info import PluginInfo

    mode = "via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0)"
    caps = Capabilities(activities={ProfilerActivity.CUDA}, mode=mode)
    info = PluginInfo(
        "cuda", "polyprof_cuda.plugin", "polyprof-cuda", "0.1.0", status="loaded", capabilities=caps
    )
    assert info.display_status == "loaded, via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0)"
    assert info.to_dict()["capabilities"]["mode"].startswith("via torch's Kineto")


def test_a_provisional_answer_is_marked_and_says_what_confirms_it() -> None:
    from polyprof.base.activity import ProfilerActivity
    from polyprof.cli import format_provisional_notes
    from polyprof.hooks.components import Capabilities
    from polyprof.hooks.plugin_info import PluginInfo

    caps = Capabilities(
        activities={ProfilerActivity.CUDA}, mode="via torch's Kineto", provisional="whether torch sees a GPU"
    )
    loaded = PluginInfo("cuda", "m", "polyprof-cuda", "0.2.0", status="loaded", capabilities=caps)
    assert loaded.display_status == "loaded, via torch's Kineto (provisional)"
    away = PluginInfo(
        "cuda",
        "m",
        "polyprof-cuda",
        "0.2.0",
        status="unavailable",
        reason="no NVIDIA driver found",
        capabilities=caps,
    )
    assert away.display_status == "unavailable (provisional): no NVIDIA driver found"
    assert away.to_dict()["capabilities"]["provisional"] == "whether torch sees a GPU"
    notes = format_provisional_notes([loaded, PluginInfo("x", "m", None, None, status="loaded")])
    assert notes.splitlines()[-1] == "  cuda: whether torch sees a GPU"
    assert "`polyprof plugins --import-torch` asks it" in notes.replace("\n", " ")
    assert format_provisional_notes([PluginInfo("x", "m", None, None, status="loaded")]) == ""


@pytest.mark.slow
def test_listing_plugins_never_imports_torch_unless_asked(tmp_path) -> None:
    """`polyprof plugins` took 11.8 to 12.6 s on a busy machine when it imported torch."""
    pytest.importorskip("torch")
    code = (
        "import sys; from polyprof.cli import main; rc = main(sys.argv[1:]); "
        "print('torch imported:', 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}

    def plugins(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, "plugins", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = plugins()
    assert listed.splitlines()[-1] == "torch imported: False"
    assert table_rows(listed)["torch_cpu"]["STATUS"] == "loaded (provisional)"
    assert "  torch_cpu: whether this torch build has the profiler polyprof reads" in listed
    asked = plugins("--import-torch")
    assert asked.splitlines()[-1] == "torch imported: True"
    assert table_rows(asked)["torch_cpu"]["STATUS"] == "loaded"
    assert "Provisional" not in asked
