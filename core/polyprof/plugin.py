"""The plugin contract: every name a polyprof plugin may use, in one namespace.

Plugin code imports from here and from nowhere else in polyprof, as pytest's
plugins import from ``pytest`` and never from ``_pytest``::

    from polyprof.plugin import Capabilities, Exporter, Trace, hookimpl

The names are defined in polyprof's own modules and re-exported here; only
this namespace is the contract: what ``__all__`` lists stays compatible within
a minor series (pin ``polyprof>=0.2.1,<0.3``; 0.2.1 is the first release with
this namespace), everything else of polyprof may change without notice.
``polyprof.testing`` is the companion for a plugin's *tests*. This is a module,
not a package: the layers below it may become subpackages of their own without
importing it.

``docs/plugin-author-guide.md`` section 5 lists the names by purpose. Keep this
module cheap and free of torch: plugins import it while ``polyprof plugins``
lists them. ``PolyprofPluginManager`` and ``Session``, the types of the hooks'
arguments, are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from polyprof.analysis.averages import KEY_AVERAGES, Aggregator, KeyAveragesSummary, summarize
from polyprof.analysis.collapsed_stacks import collapsed_stack_lines, metric_attribute
from polyprof.analysis.function_events import FunctionEventAvg
from polyprof.analysis.tree import EventTree, MergedTrace, tree_for, use_device_for
from polyprof.base.activity import (
    DISTRIBUTION_FOR_ACTIVITY,
    TORCH_COLLECTOR_ACTIVITY_NAMES,
    ProfilerActivity,
    coerce_activity,
)
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import ActivityUnavailableError, PluginUnavailable, PolyprofError, PolyprofWarning
from polyprof.base.events import (
    FIELDS,
    DeviceType,
    EventBatch,
    EventKind,
    concat,
    intern_column,
    intern_structured_column,
)
from polyprof.base.fileio import WriteCancelled, atomic_writer, check_writable_path
from polyprof.base.kineto_format import (
    CATEGORY_BY_KIND,
    DEVICE_KINDS,
    HOST_CATEGORIES,
    Arg,
    KinetoArgsText,
    KinetoLayout,
    args_mapping,
    category_of,
    device_names,
    encode_args,
    encode_args_table,
    format_us,
    kind_by_activity_type,
    kind_of_category,
    kineto_args_column,
    kineto_layout,
    trimonth_base_ns,
    us_to_ns,
)
from polyprof.base.log import Logger, get_logger
from polyprof.base.torch_support import TorchBuild, TorchFeatures, installed
from polyprof.base.trace import JsonValue, Trace
from polyprof.base.user_warnings import ActivityUnavailableWarning, user_stacklevel, warn_activity_unavailable
from polyprof.hooks.components import (
    Capabilities,
    Exporter,
    Outbox,
    Subscriber,
    TraceMetadata,
    Tracer,
)
from polyprof.hooks.hookspecs import hookimpl, hookspec
from polyprof.runtime.torch_result import (
    CollectorResult,
    FlowRule,
    HostRowKind,
    TorchResultTracer,
    decode_device_rows,
    kineto_device_reason,
)

if TYPE_CHECKING:
    from polyprof.hooks.registry import PolyprofPluginManager
    from polyprof.runtime.session import Session

#: Names loaded on first use (``__getattr__``): their modules cost more to import than this whole
#: namespace (the session pulls in the bus and anyio), and a plugin needs them only as types.
_LOADED_ON_USE = {"PolyprofPluginManager": "polyprof.hooks.registry", "Session": "polyprof.runtime.session"}


def __getattr__(name: str) -> Any:
    module = _LOADED_ON_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def installed_build() -> TorchBuild | None:
    """The installed torch's build (None when torch is not installed), read without importing torch.

    ``polyprof.base.torch_support.installed_build``, looked up at each call, so that a
    plugin sees the build the core sees (a test that fakes it there fakes it for
    both). Device plugins decide by it whether torch's Kineto owns CUPTI or PTI.
    """
    from polyprof.base import torch_support

    return torch_support.installed_build()


__all__ = [  # noqa: RUF022 - grouped by purpose, as docs/plugin-author-guide.md section 5 lists them
    # hooks: the markers, and what the hooks are given
    "PolyprofPluginManager",
    "ProfileConfig",
    "Session",
    "hookimpl",
    "hookspec",
    # components: what the hooks return
    "Aggregator",
    "Capabilities",
    "Exporter",
    "JsonValue",
    "Outbox",
    "Subscriber",
    "TraceMetadata",
    "Tracer",
    # activities
    "DISTRIBUTION_FOR_ACTIVITY",
    "ProfilerActivity",
    "coerce_activity",
    # events and traces
    "FIELDS",
    "DeviceType",
    "EventBatch",
    "EventKind",
    "Trace",
    "concat",
    "intern_column",
    "intern_structured_column",
    # the Chrome / Kineto trace format
    "CATEGORY_BY_KIND",
    "DEVICE_KINDS",
    "HOST_CATEGORIES",
    "Arg",
    "KinetoArgsText",
    "KinetoLayout",
    "args_mapping",
    "category_of",
    "device_names",
    "encode_args",
    "encode_args_table",
    "format_us",
    "kind_by_activity_type",
    "kind_of_category",
    "kineto_args_column",
    "kineto_layout",
    "trimonth_base_ns",
    "us_to_ns",
    # analysis: a trace's events with torch's semantics, key_averages, collapsed stacks
    "KEY_AVERAGES",
    "EventTree",
    "FunctionEventAvg",
    "KeyAveragesSummary",
    "MergedTrace",
    "collapsed_stack_lines",
    "metric_attribute",
    "summarize",
    "tree_for",
    "use_device_for",
    # writing files
    "WriteCancelled",
    "atomic_writer",
    "check_writable_path",
    # errors, warnings and logging
    "ActivityUnavailableError",
    "ActivityUnavailableWarning",
    "Logger",
    "PluginUnavailable",
    "PolyprofError",
    "PolyprofWarning",
    "get_logger",
    "user_stacklevel",
    "warn_activity_unavailable",
    # the installed torch
    "TorchBuild",
    "TorchFeatures",
    "installed",
    "installed_build",
    # device rows from torch's own collector
    "TORCH_COLLECTOR_ACTIVITY_NAMES",
    "CollectorResult",
    "FlowRule",
    "HostRowKind",
    "TorchResultTracer",
    "decode_device_rows",
    "kineto_device_reason",
]
