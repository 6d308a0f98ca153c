"""``polyprof.legacy.profile``: the legacy profiler API (torch's, with IPEX's ``use_xpu``).

Scripts written for ``torch.autograd.profiler_legacy.profile`` or for Intel
Extension for PyTorch's legacy profiler run unchanged against this class::

    with polyprof.legacy.profile(use_xpu=True) as prof:
        output = torch.nonzero(input_tensor)
    print(prof.key_averages().table())
    print(prof.table(sort_by="id", row_limit=100000))
    prof.export_chrome_trace("trace_file.json")

It has the legacy profile's arguments (``enabled``, ``use_cuda``,
``record_shapes``, ``with_flops``, ``profile_memory``, ``with_stack``,
``with_modules``) plus IPEX's ``use_xpu``, and its methods: ``table``,
``key_averages(group_by_input_shape, group_by_stack_n)``, ``total_average``,
``self_cpu_time_total``, ``function_events``, ``export_chrome_trace`` (the
legacy JSON *array* format, written atomically) and ``export_stacks``.
Recording goes through a polyprof ``Session`` (the torch CPU tracer plugin,
device tracer plugins, the event bus); the results are polyprof's columnar
``EventList``. As in torch, ``with_flops`` implies ``record_shapes``, and
``function_events`` lists the ``[memory]`` rows (allocations outside every
op) first, so ``key_averages()`` rows come in the legacy profiler's order.

Deliberate differences from torch 2.13's legacy profiler:

1. ``enabled=False``: ``__enter__`` returns the profile object (torch returns
   ``None``), and asking it for results (``key_averages``, ``table``,
   ``total_average``, ``export_chrome_trace``, ``export_stacks``,
   ``function_events``, ``self_cpu_time_total``, ``str``) raises
   ``ProfilerDisabledError``, a ``RuntimeError`` saying the profiler was
   disabled, instead of torch's ``AttributeError`` on ``None``. ``repr``
   does not raise; it says the profile is disabled. A disabled profile
   touches no plugin, so ``enabled=False, use_xpu=True`` works anywhere.
2. ``use_xpu=True`` / ``use_cuda=True`` need the plugin that records that
   device (``polyprof-xpu`` / ``polyprof-cuda``). When none is installed,
   ``__enter__`` raises ``ActivityUnavailableError`` naming the distribution
   to install, and nothing is left running. When the plugin is installed but
   cannot record here (no driver, no device), profiling goes on CPU-only with
   an ``ActivityUnavailableWarning`` (a ``UserWarning``, at ``__enter__``,
   with the reason) where torch's ``use_cuda`` warns "CUDA is not available,
   disabling CUDA profiling" when the profile is made. With device data the
   tables get ``Self XPU`` / ``XPU total`` / ``XPU time avg`` (or CUDA)
   columns.
3. A profile records once: a second ``__enter__``, during or after the run,
   raises ``RuntimeError("Profiler context manager is not reentrant: ...")``
   as torch does, with a message saying which case it is (an ``__enter__``
   that failed, e.g. for a missing plugin, may be retried; a disabled profile
   may be entered any number of times, as in torch). The rule is
   ``polyprof.runtime.recording.RecordOnce``, which the autograd shim follows too.
   Starting one while another polyprof profile records raises
   ``RuntimeError`` instead of silently emptying the other.
4. Results are built when first asked for, not eagerly at exit.
5. With ``with_stack=True`` ops carry their Python stacks, as in the legacy
   profiler, and the separate ``python_function`` rows that torch's newer
   collector adds are dropped, as the legacy profiler has none. The frames
   are the newer collector's (``<built-in method ...>`` frames included,
   paths shortened as torch shortens them).
6. Events are polyprof's ``FunctionEvent`` views: ``is_legacy`` is False,
   ``[memory]`` rows keep their real timestamps and ids (so
   ``table(sort_by="id")`` lists them first, where torch's id 0 puts them
   last), and device time comes from the device tracer's kernels linked to
   their launching op (kernel rows are listed too, as in ``torch.profiler``).
   For ``use_cuda=True`` that is a different measurement from torch's legacy
   profiler, which records a CUDA event pair around each op on the current
   stream and gives every op one "kernel" named after the op: polyprof's
   ``Self CUDA`` / ``CUDA total`` are the op's real kernels (its own, and
   with its children's), as ``torch.profiler`` measures them, and
   ``evt.kernels`` holds the kernels' own names. docs/shims.md ("CUDA time:
   use_cuda, use_device and use_kineto") says why and what else differs.
7. Flags take what torch's legacy profiler takes: ``enabled``, ``use_cuda``
   and ``use_xpu``, which torch only tests for truth, take any value as its
   truth value (a string warns: ``"no"`` is true); the others take bools,
   numbers, numpy bools and None, and anything else, such as
   ``record_shapes="yes"``, raises a ``TypeError`` naming the flag when the
   profile is made (torch raises one without the name, or silently records).
8. ``__exit__`` on a profile that is not recording (never entered, or
   already exited) raises ``RuntimeError``, as torch's does, with a message
   that says which; with ``enabled=False`` it does nothing, as in torch.

``export_chrome_trace`` writes what torch's legacy export writes: the host
rows (the ``"CPU functions"`` lane; the runtime calls that launched device
work are host rows too) and, per kernel an op launched, one ``cpu_to_cuda``
(``cpu_to_xpu``) flow start, but no kernel events: the device rows are in
the events and tables, and in the Kineto-shaped trace that
``polyprof.profile`` writes. ``prof.function_events.export_chrome_trace()``
writes the same file, as in torch, where the two are one call.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Literal

import attrs
import numpy as np

from polyprof.analysis.event_list import EventList
from polyprof.base.activity import ProfilerActivity
from polyprof.base.events import DeviceType
from polyprof.base.log import get_logger
from polyprof.formats.legacy_trace import write_legacy_chrome_trace
from polyprof.frontends import frontend_results
from polyprof.frontends.frontend_arguments import check_plugin_manager, config_flag, truth_flag
from polyprof.runtime.recording import Recording, RecordOnce

log = get_logger(__name__)

__all__ = ["LegacyEventList", "profile"]

#: torch's name for the synthetic rows of allocations made outside every op.
MEMORY_EVENT_NAME = "[memory]"


class profile:  # noqa: N801 - torch's name
    """Profile a block of code with the legacy profiler's arguments and results.

    :param enabled: False makes the profile record nothing (see the module notes).
    :param use_xpu: also record XPU kernels (needs the ``polyprof-xpu`` plugin).
    :param use_cuda: also record CUDA kernels (needs the ``polyprof-cuda`` plugin).
    :param record_shapes: record operator input shapes (implied by ``with_flops``).
    :param with_flops: estimate FLOPs of matmul and convolution ops.
    :param profile_memory: record tensor memory allocations and frees.
    :param with_stack: record each op's Python stack.
    :param with_modules: record the module hierarchy of ops.
    :param plugin_manager: a ``polyprof.hooks.registry`` plugin manager to use instead of
        the installed plugins (for tests).
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        use_xpu: bool = False,
        use_cuda: bool = False,
        record_shapes: bool = False,
        with_flops: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_modules: bool = False,
        plugin_manager: Any = None,
    ) -> None:
        self.enabled = truth_flag("enabled", enabled)
        self.use_xpu = truth_flag("use_xpu", use_xpu)
        self.use_cuda = truth_flag("use_cuda", use_cuda)
        self.with_flops = config_flag("with_flops", with_flops)
        # As in torch's legacy profiler: FLOPs are estimated from the input shapes.
        self.record_shapes = config_flag("record_shapes", record_shapes) or self.with_flops
        self.profile_memory = config_flag("profile_memory", profile_memory)
        self.with_stack = config_flag("with_stack", with_stack)
        self.with_modules = config_flag("with_modules", with_modules)
        check_plugin_manager(plugin_manager)
        #: ``enabled`` and record-once, as torch's legacy profiler (polyprof.runtime.recording).
        self._once = RecordOnce(enabled=self.enabled, frontend="polyprof.legacy.profile")
        self._plugin_manager = plugin_manager
        #: The gate and the session, from creation to close (polyprof.runtime.recording).
        self._lifecycle = Recording(self, self._create_session)
        self._trace_id = ""
        self._failed = False
        self._results: Any = None
        self._function_events: Any = None

    # ------------------------------------------------------------ recording

    @property
    def activities_requested(self) -> frozenset[ProfilerActivity]:
        """CPU, plus XPU and CUDA when asked for."""
        acts = {ProfilerActivity.CPU}
        if self.use_xpu:
            acts.add(ProfilerActivity.XPU)
        if self.use_cuda:
            acts.add(ProfilerActivity.CUDA)
        return frozenset(acts)

    @property
    def entered(self) -> bool:
        """torch's ``entered``: the profile started recording (False while disabled)."""
        return self._once.entered

    def __enter__(self) -> profile:
        if not self._once.enter(self._start):
            log.debug("legacy_profile_disabled")
        return self

    def _create_session(self) -> Any:
        """The session for this profile's settings (``Recording`` calls it).

        Creating it resolves the activities: a missing plugin raises here, an
        installed-but-unusable one warns and is dropped.
        """
        from polyprof.runtime.session import Session

        return Session.create(
            activities=self.activities_requested,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
            # The legacy profiler attaches stacks to ops; torch's collector needs verbose for that.
            verbose=self.with_stack,
            plugin_manager=self._plugin_manager,
        )

    def _start(self) -> None:
        """Take the gate, create the session and start its tracers; on failure leave nothing running."""
        self._lifecycle.open()
        try:
            self._trace_id = f"{uuid.uuid4().int:032X}"
            self._lifecycle.prepare(trace_id=self._trace_id)
            self._lifecycle.start()
        except BaseException:
            self._lifecycle.abort()
            self._lifecycle.close()
            raise

    def __exit__(self, exc_type: object, exc_val: object, exc_tb: object) -> Literal[False]:
        if not self.enabled:
            return False
        if not self._once.leave():
            # torch's legacy __exit__ raises here too ("Expected debug info of type PROFILER_STATE").
            state = "has already exited" if self.entered else "was never entered"
            raise RuntimeError(
                f"__exit__ called on a polyprof.legacy.profile that is not recording: it {state}; use it "
                "as `with polyprof.legacy.profile(...) as prof:`"
            )
        if self._lifecycle.in_forked_child:  # the recording is the parent's (polyprof.runtime.recording)
            self._lifecycle.close()
            return False
        try:
            trace = self._lifecycle.stop(trace_id=self._trace_id)
            self._lifecycle.trace_ready(trace)
            self._results = self._make_results(trace)
        except BaseException:
            self._failed = True
            raise
        finally:
            self._lifecycle.close()
        return False

    def _make_results(self, trace: Any) -> Any:
        from polyprof.analysis.results import ProfileResults
        from polyprof.analysis.tree import use_device_for

        if self.with_stack:
            trace = _without_python_functions(trace)
        return ProfileResults(
            traces=(trace,),
            use_device=use_device_for(trace.config),
            aggregators=self._lifecycle.session.aggregators,
        )

    # ------------------------------------------------------------ results

    def _finished_events(self, what: str) -> Any:
        self._once.check_enabled(what)
        events = self.function_events
        if events is None:
            if self._lifecycle.in_forked_child:
                raise RuntimeError(f"{what}: no results: {self._lifecycle.forked_child_message()}")
            if self._failed:
                raise RuntimeError(
                    f"{what}: profiling failed when the profiler stopped, so there are no results"
                )
            if self._lifecycle.recording:
                raise RuntimeError(
                    f"{what}: Profiler didn't finish running; results are available after the with-block ends"
                )
            raise RuntimeError(
                f"{what}: Profiler didn't finish running; it was never entered (use it in a with-block)"
            )
        return events

    @property
    def use_device(self) -> str | None:
        """The device whose time the tables show (``"cuda"``, ``"xpu"`` or None), once recorded."""
        return self._results.use_device if self._results is not None else None

    @property
    def function_events(self) -> Any:
        """Every recorded event as an ``EventList`` (None until the with-block ends)."""
        self._once.check_enabled("function_events")
        if self._function_events is None and self._results is not None:
            self._function_events = _legacy_event_list(self._results)
        return self._function_events

    # torch's table (``sort_by="id"``: newest first, as torch sorts descending), total_average() and
    # self_cpu_time_total, over function_events.
    table = frontend_results.table
    total_average = frontend_results.total_average
    self_cpu_time_total = frontend_results.self_cpu_time_total

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> Any:
        """Events averaged by name (and input shapes, and the top ``group_by_stack_n`` frames).

        In the legacy profiler's row order, through the session's ``key_averages`` aggregator.
        """
        return self._finished_events("key_averages()").key_averages(group_by_input_shape, group_by_stack_n)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """Write torch's legacy Chrome trace (a JSON array of ``"ph": "X"`` events) atomically.

        The host rows, with one ``cpu_to_<device>`` flow start per kernel an op
        launched; no device rows, as torch's legacy export has none.

        :returns: the path written.
        """
        return self._finished_events("export_chrome_trace()").export_chrome_trace(path)

    def export_stacks(self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> str:
        """Write collapsed stacks (flame graph input); needs ``with_stack=True``."""
        events = self._finished_events("export_stacks()")
        if not self.with_stack:
            raise RuntimeError(
                "export_stacks() requires with_stack=True: create the profile with "
                "polyprof.legacy.profile(with_stack=True, ...)"
            )
        return events.export_stacks(path, metric)

    def __str__(self) -> str:
        self._once.check_enabled("str(profile)")
        if self.function_events is None:
            return "<unfinished polyprof.legacy.profile>"
        return str(self.function_events)

    def __repr__(self) -> str:
        if not self.enabled:
            return "<polyprof.legacy.profile enabled=False: disabled, records nothing>"
        if self.function_events is None:
            acts = ",".join(sorted(a.name for a in self.activities_requested))
            state = "recording" if self._lifecycle.recording else "failed" if self._failed else "not started"
            return f"<unfinished polyprof.legacy.profile activities={acts} {state}>"
        return repr(self.function_events)


def _without_python_functions(trace: Any) -> Any:
    """``trace`` without ``python_function`` events (the legacy profiler records none)."""
    from polyprof.base.events import EventKind

    events = trace.events
    python = events["kind"] == EventKind.PYTHON_FUNCTION
    if not python.any():
        return trace
    return attrs.evolve(trace, events=events.take(np.flatnonzero(~python)))


class LegacyEventList(EventList):
    """``function_events`` of a legacy profile: an ``EventList`` whose Chrome export is torch's legacy one.

    torch's legacy profile's ``export_chrome_trace`` is its ``function_events``'
    (one call), and its events have no device rows: kernels hang off the ops
    that launched them. Here the kernel rows are events too (as in
    ``torch.profiler``), so the export leaves them out and keeps each one as
    its op's ``cpu_to_<device>`` flow start, as torch writes it.
    """

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        host = [evt for evt in self if int(evt.device_type) == DeviceType.CPU]
        return write_legacy_chrome_trace(host, path, device_name=self._use_device or "cuda")


def _legacy_event_list(results: Any) -> Any:
    """The events in the legacy profiler's order: ``[memory]`` rows first, then the rest as recorded.

    torch's legacy parse gives those rows start time 0, so its sort puts them first.
    """
    tree = results.tree()
    rows = None
    if MEMORY_EVENT_NAME in tree.keys:
        memory = tree.synthetic & (tree.key == tree.keys.index(MEMORY_EVENT_NAME))
        if memory.any():
            rows = np.concatenate([np.flatnonzero(memory), np.flatnonzero(~memory)])
    return results.event_list(rows, list_type=LegacyEventList)
