"""Profiler activities, spelled as torch spells them, and the devices that record them.

``ProfilerActivity`` has torch's member names and integer values, so user code
that passes ``torch.profiler.ProfilerActivity.CPU`` or ``polyprof.ProfilerActivity.CPU``
(or the strings ``"cpu"``, ``"cuda"``, ``"xpu"``) means the same thing.

``DEVICES`` is the device vocabulary: one ``Device`` row per accelerator with
everything torch, its Kineto and polyprof spell per device (its activity,
``DeviceType``, ``use_device``, Kineto's categories and lane names, the
distribution that records it, torch's per-device rules). Every layer reads it
(``DISTRIBUTION_FOR_ACTIVITY`` and the other tables below, the trace format,
the tree, the readers, the frontends), so a new device is one row here plus
its plugin (and, for a device type or activity torch adds, its member in
``polyprof.base.events.DeviceType`` or ``ProfilerActivity``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs

from polyprof.base.events import DeviceType


class ProfilerActivity(enum.IntEnum):
    """What a tracer records. Values match ``torch.profiler.ProfilerActivity``."""

    CPU = 0
    XPU = 1
    CUDA = 2
    HPU = 3
    MTIA = 4
    PrivateUse1 = 5


@attrs.frozen
class Device:
    """One accelerator as torch, its Kineto and polyprof spell it: a row of ``DEVICES``."""

    #: The activity that records it. Rows that share one (CUDA and ROCm's HIP) share its
    #: per-activity facts: ``use_device``, ``distribution``, ``autograd_use_device``.
    activity: ProfilerActivity
    #: torch's ``DeviceType`` of its rows (the ``device_type`` column of ``polyprof.base.events``).
    device_type: DeviceType
    #: torch's ``use_device`` for it ("cuda"): the accelerator whose time the tables show.
    use_device: str
    #: The prefix of Kineto's device categories: "cuda" for "cuda_runtime", "cuda_driver", "cuda_sync".
    category_prefix: str
    #: The first word of its lanes' ``process_name`` in a Chrome trace: "CUDA" for "CUDA 0".
    lane_name: str
    #: The first word of its lanes' ``process_labels``: "GPU" for CUDA and HIP, else ``lane_name``.
    lane_label: str
    #: The polyprof distribution that records it (what ``ActivityUnavailableError`` tells the user
    #: to install); None where polyprof ships none.
    distribution: str | None
    #: Kineto's activity types of its host calls that sit in the CPU group (a
    #: ``{ProfilerActivity.CPU: [...]}`` filter takes them): "CUDA_RUNTIME", "CUDA_DRIVER".
    cpu_group_activity_types: tuple[str, ...]
    #: ``torch.autograd.profiler.profile`` takes ``use_device`` for it (PrivateUse1: only under the
    #: name its backend was renamed to, asked of torch).
    autograd_use_device: bool
    #: torch's post-processing makes its rows kernels of the CPU op that launched them.
    kernels: bool
    #: torch's post-processing counts its rows' own elapsed time as their device time.
    timed: bool
    #: The first torch release whose memory records on it count as device memory ((0, 0): every
    #: release); None: never (they count as neither CPU nor device memory).
    device_memory_since: tuple[int, int] | None
    #: torch's table adds its rows' self device time (user annotations left out) into the device
    #: time footer and the ``Self {DEV} %`` denominator (``_build_table``'s Kineto-mode list).
    table_device_time: bool
    #: The entry-point name (group ``polyprof``) of ``distribution``'s plugin, which polyprof's own
    #: distributions keep when a third party registers it too; None where ``distribution`` is None.
    entry_point: str | None

    @property
    def collector_activity(self) -> str:
        """The ``torch.profiler.ProfilerActivity`` member name torch's collector takes for it."""
        return self.activity.name


#: The devices, in torch's priority order for ``use_device`` (CUDA > XPU > MTIA > HPU >
#: PrivateUse1); the first is the device Kineto's format assumes where nothing names one.
#: Positional columns: activity, device_type, use_device, category_prefix, lane_name, lane_label,
#: distribution, cpu_group_activity_types.
DEVICES: tuple[Device, ...] = (
    Device(
        ProfilerActivity.CUDA, DeviceType.CUDA, "cuda", "cuda", "CUDA", "GPU", "polyprof-cuda",
        ("CUDA_RUNTIME", "CUDA_DRIVER"), autograd_use_device=True, kernels=True, timed=True,
        device_memory_since=(0, 0),
        table_device_time=True, entry_point="cuda",
    ),
    # ROCm: torch records it as CUDA, and its Kineto keeps the cuda_* categories.
    Device(
        ProfilerActivity.CUDA, DeviceType.HIP, "cuda", "cuda", "HIP", "GPU", "polyprof-cuda",
        ("CUDA_RUNTIME", "CUDA_DRIVER"), autograd_use_device=True, kernels=False, timed=False,
        device_memory_since=(0, 0),
        table_device_time=False, entry_point="cuda",
    ),
    Device(
        ProfilerActivity.XPU, DeviceType.XPU, "xpu", "xpu", "XPU", "XPU", "polyprof-xpu",
        ("XPU_RUNTIME", "XPU_DRIVER"), autograd_use_device=True, kernels=True, timed=True,
        device_memory_since=(2, 8),
        table_device_time=True, entry_point="xpu",
    ),
    Device(
        ProfilerActivity.MTIA, DeviceType.MTIA, "mtia", "mtia", "MTIA", "MTIA", None,
        (), autograd_use_device=True, kernels=False, timed=True, device_memory_since=None,
        table_device_time=True, entry_point=None,
    ),
    Device(
        ProfilerActivity.HPU, DeviceType.HPU, "hpu", "hpu", "HPU", "HPU", None,
        (), autograd_use_device=True, kernels=False, timed=True, device_memory_since=None,
        table_device_time=False, entry_point=None,
    ),
    Device(
        ProfilerActivity.PrivateUse1, DeviceType.PrivateUse1, "privateuseone", "privateuse1",
        "PrivateUse1", "PrivateUse1", None, ("PRIVATEUSE1_RUNTIME", "PRIVATEUSE1_DRIVER"),
        autograd_use_device=False, kernels=True, timed=True, device_memory_since=(0, 0),
        table_device_time=True, entry_point=None,
    ),
)  # fmt: skip


def device_for_activity(activity: Any) -> Device | None:
    """The first row of ``DEVICES`` recorded by ``activity`` (CUDA's, not HIP's); None for CPU."""
    activity = coerce_activity(activity)
    return next((d for d in DEVICES if d.activity is activity), None)


def device_for_type(device_type: int) -> Device | None:
    """The row of torch's ``DeviceType`` value ``device_type``; None for the CPU's and unknown ones."""
    return next((d for d in DEVICES if d.device_type == device_type), None)


def device_for_use_device(use_device: str | None) -> Device | None:
    """The first row whose ``use_device`` is ``use_device`` ("cuda": CUDA's); None for any other."""
    return next((d for d in DEVICES if d.use_device == use_device), None)


def use_device_for_activities(activities: Iterable[Any]) -> str | None:
    """torch's ``use_device`` for recorded ``activities``: the first device's in ``DEVICES`` order."""
    recorded = frozenset(activities)
    return next((d.use_device for d in DEVICES if d.activity in recorded), None)


#: The distribution a user installs to get an activity the core does not provide.
DISTRIBUTION_FOR_ACTIVITY: dict[ProfilerActivity, str] = {
    d.activity: d.distribution for d in DEVICES if d.distribution is not None
}

#: torch's ``ProfilerActivity`` members a device plugin may ask torch's collector for (CPU is the
#: collector owner's own).
TORCH_COLLECTOR_ACTIVITY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(d.collector_activity for d in DEVICES))

#: torch's ``use_device`` values, in its priority order.
USE_DEVICES: tuple[str, ...] = tuple(dict.fromkeys(d.use_device for d in DEVICES))

#: Kineto's activity types of the CPU group: the names a ``{ProfilerActivity.CPU: [...]}`` filter
#: takes (any other makes torch's collector raise), each the upper-case spelling of the trace
#: category its events are written under: the host's, then each device's host calls. Asked of
#: torch 2.13 and 2.15 by tests/test_frontend_versions.py.
CPU_GROUP_ACTIVITY_TYPES: tuple[str, ...] = (
    "CPU_OP",
    "CPU_INSTANT_EVENT",
    "USER_ANNOTATION",
    "EXTERNAL_CORRELATION",
    "PYTHON_FUNCTION",
    *dict.fromkeys(t for d in DEVICES for t in d.cpu_group_activity_types),
)

_BY_LOWER_NAME = {member.name.lower(): member for member in ProfilerActivity}


def coerce_activity(value: Any) -> ProfilerActivity:
    """Turn a polyprof or torch activity, or its name, into ``ProfilerActivity``.

    Raises ``ValueError`` naming the valid choices for anything else.
    """
    if isinstance(value, ProfilerActivity):
        return value
    name = getattr(value, "name", None)  # torch's pybind enum has .name
    if isinstance(name, str) and name.lower() in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[name.lower()]
    if isinstance(value, str) and value.lower() in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[value.lower()]
    valid = ", ".join(f"ProfilerActivity.{m.name}" for m in ProfilerActivity)
    raise ValueError(f"unknown profiler activity {value!r}; valid activities are: {valid}")
