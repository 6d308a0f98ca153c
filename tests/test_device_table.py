"""polyprof.base.activity.DEVICES: the device vocabulary, one row per device, that every layer reads.

The tables the layers kept before (``DISTRIBUTION_FOR_ACTIVITY``, Kineto's
device names, the tree's device lists, ``use_device``, ...) are now derived
from the rows; these tests hold them to the values they had when each was
spelled out (written out once, below), check that no consumer module spells a
device itself, and change a row in a fresh interpreter to see every consumer
follow, so that a new device is one row plus its plugin.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polyprof.analysis import table, tree
from polyprof.base import activity, kineto_format
from polyprof.base.activity import (
    DEVICES,
    ProfilerActivity,
    device_for_activity,
    device_for_type,
    device_for_use_device,
    use_device_for_activities,
)
from polyprof.base.config import ProfileConfig
from polyprof.base.events import DeviceType, EventKind
from polyprof.formats import chrome_reader
from polyprof.frontends import autograd_profile
from polyprof.hooks import plugin_discovery

ROOT = Path(__file__).resolve().parents[1]

PA = ProfilerActivity
DT = DeviceType
RUNTIME, DRIVER = EventKind.RUNTIME, EventKind.DRIVER

# ------------------------------------------------- the values before the table

OLD_DISTRIBUTION_FOR_ACTIVITY = {PA.CUDA: "polyprof-cuda", PA.XPU: "polyprof-xpu"}
OLD_TORCH_COLLECTOR_ACTIVITY_NAMES = ("CUDA", "XPU", "MTIA", "HPU", "PrivateUse1")
OLD_CPU_GROUP_ACTIVITY_TYPES = (
    "CPU_OP",
    "CPU_INSTANT_EVENT",
    "USER_ANNOTATION",
    "EXTERNAL_CORRELATION",
    "PYTHON_FUNCTION",
    "CUDA_RUNTIME",
    "CUDA_DRIVER",
    "XPU_RUNTIME",
    "XPU_DRIVER",
    "PRIVATEUSE1_RUNTIME",
    "PRIVATEUSE1_DRIVER",
)
OLD_DEVICE_NAMES = {
    int(DT.CUDA): ("cuda", "CUDA"),
    int(DT.HIP): ("cuda", "HIP"),
    int(DT.XPU): ("xpu", "XPU"),
    int(DT.HPU): ("hpu", "HPU"),
    int(DT.MTIA): ("mtia", "MTIA"),
    int(DT.PrivateUse1): ("privateuse1", "PrivateUse1"),
}
OLD_DEFAULT_DEVICE_TYPE = int(DT.CUDA)
OLD_GPU_LANE_NAMES = frozenset({"CUDA", "HIP"})
OLD_DEVICE_BY_PREFIX = {
    "cuda": DT.CUDA,
    "xpu": DT.XPU,
    "hpu": DT.HPU,
    "mtia": DT.MTIA,
    "privateuse1": DT.PrivateUse1,
}
OLD_DEVICE_BY_LANE_LABEL = {
    "CUDA": DT.CUDA,
    "HIP": DT.HIP,
    "XPU": DT.XPU,
    "HPU": DT.HPU,
    "MTIA": DT.MTIA,
    "PrivateUse1": DT.PrivateUse1,
    "GPU": DT.CUDA,
}
#: In order: torch's autograd profile lists them so in its "valid devices" message.
OLD_AUTOGRAD_DEVICE_ACTIVITY = [("cuda", PA.CUDA), ("xpu", PA.XPU), ("mtia", PA.MTIA), ("hpu", PA.HPU)]
#: In order: torch's priority for ``use_device``.
OLD_VALID_USE_DEVICES = (None, "cuda", "xpu", "mtia", "hpu", "privateuseone")
#: The tree's device lists feed ``np.isin``: their order never mattered. Device memory: from torch
#: 2.8 (the rules' ``device_memory_devices``), and before it.
OLD_DEVICE_MEMORY_DEVICES = {DT.CUDA, DT.PrivateUse1, DT.HIP, DT.XPU}
OLD_DEVICE_MEMORY_DEVICES_BEFORE_2_8 = {DT.CUDA, DT.PrivateUse1, DT.HIP}
OLD_KERNEL_DEVICES = {DT.CUDA, DT.PrivateUse1, DT.XPU}
OLD_TIMED_DEVICES = {DT.CUDA, DT.PrivateUse1, DT.MTIA, DT.HPU, DT.XPU}
#: The table's device kinds whose self device time its footer adds (torch's ``_build_table`` list).
OLD_TABLE_DEVICE_KINDS = frozenset({"CUDA", "PrivateUse1", "MTIA", "XPU"})
#: polyprof's own plugin distributions' entry-point names.
OLD_OWNED_NAMES = {"cuda": "polyprof-cuda", "xpu": "polyprof-xpu"}
OLD_ACTIVITY_BY_DEVICE = {
    DT.CUDA: PA.CUDA,
    DT.HIP: PA.CUDA,
    DT.XPU: PA.XPU,
    DT.HPU: PA.HPU,
    DT.MTIA: PA.MTIA,
    DT.PrivateUse1: PA.PrivateUse1,
}


def test_the_activity_tables_keep_their_values() -> None:
    assert activity.DISTRIBUTION_FOR_ACTIVITY == OLD_DISTRIBUTION_FOR_ACTIVITY
    assert type(activity.DISTRIBUTION_FOR_ACTIVITY) is dict
    assert activity.TORCH_COLLECTOR_ACTIVITY_NAMES == OLD_TORCH_COLLECTOR_ACTIVITY_NAMES
    assert activity.CPU_GROUP_ACTIVITY_TYPES == OLD_CPU_GROUP_ACTIVITY_TYPES
    assert activity.USE_DEVICES == OLD_VALID_USE_DEVICES[1:]


def test_the_trace_formats_device_names_keep_their_values() -> None:
    assert kineto_format.DEVICE_NAMES == OLD_DEVICE_NAMES
    assert kineto_format.DEFAULT_DEVICE_TYPE == OLD_DEFAULT_DEVICE_TYPE
    assert type(kineto_format.DEFAULT_DEVICE_TYPE) is int
    assert kineto_format.GPU_LANE_NAMES == OLD_GPU_LANE_NAMES
    assert kineto_format.DEVICE_BY_PREFIX == OLD_DEVICE_BY_PREFIX
    assert kineto_format.DEVICE_BY_LANE_LABEL == OLD_DEVICE_BY_LANE_LABEL
    assert all(type(k) is int for k in kineto_format.DEVICE_NAMES)


def test_the_frontends_and_readers_tables_keep_their_values() -> None:
    assert list(autograd_profile.DEVICE_ACTIVITY.items()) == OLD_AUTOGRAD_DEVICE_ACTIVITY
    assert chrome_reader._ACTIVITY_BY_DEVICE == OLD_ACTIVITY_BY_DEVICE
    assert tree.VALID_USE_DEVICES == OLD_VALID_USE_DEVICES
    for minor in range(6, 17):  # every supported release, and one past the newest
        memory_devices = tree.PostProcessingRules.for_torch(2, minor).device_memory_devices
        old = OLD_DEVICE_MEMORY_DEVICES if minor >= 8 else OLD_DEVICE_MEMORY_DEVICES_BEFORE_2_8
        assert set(memory_devices) == old, minor
        assert type(memory_devices) is tuple  # np.isin reads a set as one object, a tuple as its items
    assert set(tree._KERNEL_DEVICES) == OLD_KERNEL_DEVICES
    assert set(tree._TIMED_DEVICES) == OLD_TIMED_DEVICES
    for devices in (tree._KERNEL_DEVICES, tree._TIMED_DEVICES):
        assert type(devices) is tuple  # np.isin reads a set as one object, a tuple as its items
    assert table._KINETO_DEVICE_KINDS == OLD_TABLE_DEVICE_KINDS
    assert dict(plugin_discovery.OWNED_NAMES) == OLD_OWNED_NAMES
    assert list(plugin_discovery.OWNED_NAMES) == list(OLD_OWNED_NAMES)


@pytest.mark.parametrize(
    ("activities", "expected"),
    [
        ((PA.CPU,), None),
        ((PA.CPU, PA.XPU, PA.CUDA), "cuda"),
        ((PA.XPU, PA.HPU), "xpu"),
        ((PA.HPU, PA.MTIA), "mtia"),
        ((PA.HPU, PA.PrivateUse1), "hpu"),
        ((PA.PrivateUse1,), "privateuseone"),
    ],
)
def test_use_device_follows_torchs_priority(activities: tuple[PA, ...], expected: str | None) -> None:
    assert use_device_for_activities(activities) == expected
    assert tree.use_device_for(ProfileConfig(activities=set(activities))) == expected


def test_the_lookups() -> None:
    assert device_for_activity(PA.CPU) is None
    cuda = device_for_activity("cuda")
    assert cuda is not None and cuda.device_type is DT.CUDA and cuda.collector_activity == "CUDA"
    hip = device_for_type(int(DT.HIP))
    assert hip is not None and hip.activity is PA.CUDA and hip.lane_name == "HIP"
    assert device_for_type(int(DT.CPU)) is None
    assert device_for_use_device("cuda") is cuda
    assert device_for_use_device("npu") is None and device_for_use_device(None) is None


# ---------------------------------------------------------- the rows themselves


def test_each_device_type_has_one_row_and_rows_of_one_activity_agree() -> None:
    assert len({d.device_type for d in DEVICES}) == len(DEVICES)
    assert PA.CPU not in {d.activity for d in DEVICES}
    for row in DEVICES:
        first = device_for_activity(row.activity)
        assert first is not None
        shared = (
            "use_device",
            "distribution",
            "entry_point",
            "autograd_use_device",
            "cpu_group_activity_types",
        )
        assert {k: getattr(row, k) for k in shared} == {k: getattr(first, k) for k in shared}, row
        assert (row.entry_point is None) == (row.distribution is None), row


def test_cpu_group_activity_types_are_kinetos_spelling_of_the_host_call_categories() -> None:
    """Kineto's activity type of a category is its upper-case spelling ("cuda_runtime": CUDA_RUNTIME)."""
    for row in DEVICES:
        if row.cpu_group_activity_types:
            categories = [kineto_format.category_of(kind, row.device_type) for kind in (RUNTIME, DRIVER)]
            assert row.cpu_group_activity_types == tuple(str(c).upper() for c in categories)


# ------------------------------------------------------------ nobody else spells one

#: Modules that once kept their own copy of the device list, and those around them.
CONSUMERS = [
    "activity_resolution",
    "registry",
    "profiler",
    "autograd_profile",
    "tree",
    "chrome_reader",
    "kineto_format",
    "events",
    "torch_result",
    "table",
    "plugin_discovery",
]

#: (module, spelling) that is not a per-device fact of the table, and why.
NOT_TABLE_FACTS = {
    ("profiler", "ProfilerActivity.CUDA"): "torch's use_cuda flag adds or removes CUDA itself",
    ("profiler", "cuda"): "torch.version.cuda: the CUDA build's version (CUPTI and CUDA graphs)",
    ("autograd_profile", "cuda"): "torch's use_cuda=True means use_device='cuda'",
    ("autograd_profile", "ProfilerActivity.PrivateUse1"): "torch takes PrivateUse1 under its renamed backend",
    ("kineto_format", "GPU"): "GPU_LANE_LABEL: the label word Kineto gives CUDA and HIP lanes",
    # torch's table rewrites exactly these three legacy names of sort_by's metrics to "device".
    ("table", "cuda"): "torch's sort_by rewrite (profiler_util's metric.replace('cuda', 'device'))",
    ("table", "xpu"): "torch's sort_by rewrite (metric.replace('xpu', 'device'))",
    ("table", "privateuse1"): "torch's sort_by rewrite (metric.replace('privateuse1', 'device'))",
}


def _vocabulary() -> tuple[set[str], set[str]]:
    """(strings, ``Enum.MEMBER`` spellings) that name a device of the table."""
    strings: set[str] = set()
    for d in DEVICES:
        strings |= {d.use_device, d.category_prefix, d.lane_name, d.lane_label, d.collector_activity}
        strings |= set(d.cpu_group_activity_types) | ({d.distribution} if d.distribution else set())
        strings |= {d.entry_point} if d.entry_point else set()
    members = {f"ProfilerActivity.{d.activity.name}" for d in DEVICES}
    members |= {f"DeviceType.{d.device_type.name}" for d in DEVICES}
    return strings, members


def _device_spellings(module: str) -> set[str]:
    """The device names a module's code spells (docstrings and comments left out)."""
    [path] = (ROOT / "core" / "polyprof").rglob(f"{module}.py")
    syntax = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(syntax)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    strings, members = _vocabulary()
    found: set[str] = set()
    for node in ast.walk(syntax):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in strings:
                found.add(node.value)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            spelled = f"{node.value.id}.{node.attr}"
            if spelled in members:
                found.add(spelled)
    return found


@pytest.mark.parametrize("module", CONSUMERS)
def test_no_consumer_spells_a_device(module: str) -> None:
    allowed = {spelling for (owner, spelling) in NOT_TABLE_FACTS if owner == module}
    found = _device_spellings(module)
    assert found <= allowed, (
        f"polyprof.{module} spells devices itself: {sorted(found - allowed)}; derive them from "
        "polyprof.base.activity.DEVICES (or name the exception in NOT_TABLE_FACTS, with why)"
    )
    assert allowed <= found, (
        f"NOT_TABLE_FACTS names what polyprof.{module} no longer spells: {allowed - found}"
    )


# ------------------------------------------------- a changed row reaches everyone

#: Run in a fresh interpreter: polyprof.base.activity is executed with DEVICES amended right after its
#: assignment (HPU's row renamed to a "gaudi" device with a distribution and host-call types,
#: MTIA's row removed, XPU's memory counted as device memory from torch 2.12), then every consumer is
#: imported and asked.
_AMENDED_TABLE = textwrap.dedent(
    """
    import ast, importlib.abc, importlib.util, sys
    import attrs

    SPEC = importlib.util.find_spec("polyprof")
    PATH = SPEC.submodule_search_locations[0] + "/base/activity.py"

    def amend(devices):
        hpu = next(d for d in devices if d.device_type.name == "HPU")
        gaudi = attrs.evolve(
            hpu, use_device="gaudi", category_prefix="gaudi", lane_name="Gaudi", lane_label="Gaudi",
            distribution="polyprof-gaudi", cpu_group_activity_types=("GAUDI_RUNTIME", "GAUDI_DRIVER"),
            kernels=True, device_memory_since=(0, 0), table_device_time=True, entry_point="gaudi",
        )
        # XPU's memory counted as device memory from a later release than torch's 2.8.
        amended = {hpu: gaudi}
        xpu = next(d for d in devices if d.device_type.name == "XPU")
        amended[xpu] = attrs.evolve(xpu, device_memory_since=(2, 12))
        return tuple(amended.get(d, d) for d in devices if d.device_type.name != "MTIA")

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            with open(PATH) as f:
                syntax = ast.parse(f.read(), PATH)
            at = next(
                i for i, node in enumerate(syntax.body)
                if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "DEVICES"
            )
            syntax.body.insert(at + 1, ast.parse("DEVICES = _amend(DEVICES)").body[0])
            ast.fix_missing_locations(syntax)
            module._amend = amend
            exec(compile(syntax, PATH, "exec"), module.__dict__)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "polyprof.base.activity":
                return importlib.util.spec_from_file_location(name, PATH, loader=Loader())
            return None

    sys.meta_path.insert(0, Finder())

    from polyprof.base import activity, kineto_format
    from polyprof.hooks import activity_resolution
    from polyprof.frontends import autograd_profile
    from polyprof.formats import chrome_reader
    from polyprof.analysis import table, tree
    from polyprof.hooks import plugin_discovery
    from polyprof.base.activity import ProfilerActivity as PA
    from polyprof.base.config import ProfileConfig
    from polyprof.base.events import DeviceType as DT, EventKind
    from polyprof.hooks.plugin_calls import PluginCallError

    assert len(activity.DEVICES) == 5
    assert activity.DISTRIBUTION_FOR_ACTIVITY[PA.HPU] == "polyprof-gaudi"
    assert activity.TORCH_COLLECTOR_ACTIVITY_NAMES == ("CUDA", "XPU", "HPU", "PrivateUse1")
    assert activity.CPU_GROUP_ACTIVITY_TYPES[-4:-2] == ("GAUDI_RUNTIME", "GAUDI_DRIVER")
    assert "ProfilerActivity.HPU needs the polyprof-gaudi plugin" in (
        activity_resolution.explain_missing_activity((), PA.HPU)
    )
    try:
        activity_resolution.check_collector_answer("p", ["MTIA"])
    except PluginCallError:
        pass
    else:
        raise AssertionError("MTIA is no collector activity any more")
    assert kineto_format.DEVICE_NAMES[int(DT.HPU)] == ("gaudi", "Gaudi")
    assert int(DT.MTIA) not in kineto_format.DEVICE_NAMES
    assert kineto_format.category_of(EventKind.RUNTIME, DT.HPU) == "gaudi_runtime"
    assert kineto_format.kind_of_category("gaudi_driver") == (EventKind.DRIVER, DT.HPU)
    assert kineto_format.DEVICE_BY_LANE_LABEL["Gaudi"] is DT.HPU
    assert "HPU" not in kineto_format.DEVICE_BY_LANE_LABEL
    assert tree.VALID_USE_DEVICES == (None, "cuda", "xpu", "gaudi", "privateuseone")
    assert tree.use_device_for(ProfileConfig(activities={PA.CPU, PA.HPU})) == "gaudi"
    assert DT.HPU in tree._KERNEL_DEVICES
    memory_devices = {m: tree.PostProcessingRules.for_torch(2, m).device_memory_devices for m in (6, 11, 12)}
    assert DT.HPU in memory_devices[6] and DT.XPU not in memory_devices[11] and DT.XPU in memory_devices[12]
    assert table._KINETO_DEVICE_KINDS == {"CUDA", "XPU", "HPU", "PrivateUse1"}
    assert dict(plugin_discovery.OWNED_NAMES) == {
        "cuda": "polyprof-cuda", "xpu": "polyprof-xpu", "gaudi": "polyprof-gaudi"
    }
    assert DT.MTIA not in tree._TIMED_DEVICES
    assert autograd_profile.DEVICE_ACTIVITY == {"cuda": PA.CUDA, "xpu": PA.XPU, "gaudi": PA.HPU}
    assert chrome_reader._ACTIVITY_BY_DEVICE[DT.HPU] is PA.HPU
    assert DT.MTIA not in chrome_reader._ACTIVITY_BY_DEVICE
    print("every consumer follows the table")
    """
)


def test_a_changed_row_reaches_every_consumer() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _AMENDED_TABLE], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "every consumer follows the table" in result.stdout
