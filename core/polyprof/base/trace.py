"""A finished recording: every event of one profiling cycle plus its metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import attrs

from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventBatch

#: A JSON value as ``json.loads`` gives it (read-only containers, so a ``dict[str, int]`` is one).
JsonValue: TypeAlias = "bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue] | None"

#: ProfileConfig flags torch writes as top-level trace metadata (``1`` when set), in torch's order.
CONFIG_FLAG_KEYS = ("profile_memory", "with_stack", "record_shapes", "with_modules", "with_flops")

#: Top-level keys of Kineto's Chrome trace format itself; user metadata may not reuse them.
CHROME_TRACE_RESERVED_KEYS = frozenset(
    {
        "schemaVersion",
        "deviceProperties",
        "displayTimeUnit",
        "baseTimeNanoseconds",
        "traceEvents",
        "traceName",
    }
)


@attrs.frozen(eq=False)
class Trace:
    """What exporters and aggregators read. Immutable, safe across threads."""

    #: All events of the cycle, from every tracer, in one batch.
    events: EventBatch
    config: ProfileConfig
    #: Unix-epoch ns when recording started and stopped.
    start_ns: int
    end_ns: int
    pid: int
    hostname: str = ""
    trace_id: str = ""
    #: Top-level trace metadata (``add_metadata``): key -> raw JSON text of the value.
    metadata_json: Mapping[str, str] = attrs.field(factory=dict)
    #: Kineto ``deviceProperties`` entries (dicts), one per device seen.
    device_properties: tuple[Mapping[str, JsonValue], ...] = ()
    #: Per-tracer notes for the user (e.g. "cuda: 12 records dropped by CUPTI").
    notes: tuple[str, ...] = ()
