"""Plain helpers for tests/gpu: summaries of a profile, comparisons with torch.profiler, verdicts.

Nothing here needs a GPU or imports torch at module level, so
tests/gpu/test_gpu_helpers.py checks every function on synthetic inputs on
any machine; tests/gpu/gpu_child.py and tests/gpu/test_cuda_vs_torch.py use
them on a GPU.
"""

from __future__ import annotations

import decimal
import json
import math
import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Per-key Self CUDA of polyprof's own recording against torch.profiler's (each the median of its
#: recordings; ops, device rows and the GPU spans of ``record_function`` ranges alike) is allowed
#: ``SPREAD_FACTOR`` x torch's own spread of it, measured: the largest of the distance between the
#: medians of two torch.profiler children (two processes) and every recording's distance to its own
#: child's median, relative to torch's median; pooled as the largest such spread over the significant
#: keys of the same class (work, or range spans, whose idle gaps make them noisier). Never tighter than
#: SELF_DEVICE_TOLERANCE (significant keys), SMALL_KEY_TOLERANCE (small keys) or SHORT_EVENT_TOLERANCE
#: (keys of short events), and for a significant key never looser than SPREAD_CEILING: past it a
#: run-to-run comparison would pass anything (a 34% error in a range's span passes a limit of 2 x a
#: 20% spread). Such a key, and every range, is judged by the same recording read both ways instead,
#: where that reading is exact (``same_recording_report``: the same events, so any difference is
#: attribution): on an H200 the GPU spans of ``ProfilerStep*`` differed by up to 42% between two
#: torch.profiler processes of one host-bound workload and by 12-28% from polyprof's, in either
#: direction, while polyprof's reading of each recording equalled torch's. Without that reading the
#: spread and the ceiling judge them. A key missing from some of torch's
#: recordings has a spread of 100% that measures its appearance, not timing: it sets its own limit,
#: never its class's.
SPREAD_FACTOR = 2.0
SELF_DEVICE_TOLERANCE = 0.02
SPREAD_CEILING = 0.25
#: Keys whose torch Self CUDA is below this fraction of the workload's device time are "small":
#: a few hundred ns of jitter on a microsecond kernel is several percent of it, so their floor is
#: SMALL_KEY_TOLERANCE (both maxima are recorded).
SIGNIFICANT_FRACTION = 0.005
SMALL_KEY_TOLERANCE = 0.10
#: Keys whose events last under SHORT_EVENT_US on average in torch's recordings (fills and copies of
#: about a microsecond) move together with the GPU's state from one recording to the next: on an H200
#: the 50 one-microsecond fills of a CUDA graph took 50.5 to 56.1 µs over four torch.profiler
#: recordings in one process (11%), and two torch processes both saw about 48.5 µs, so a spread
#: measured from two processes can miss it. Their floor is twice that 11%.
SHORT_EVENT_US = 2.0
SHORT_EVENT_TOLERANCE = 0.22
#: One recording read both ways (torch's ``key_averages`` and polyprof's reading of torch's own
#: result): the same events, so only the order of float sums may differ.
SAME_RECORDING_TOLERANCE = 1e-9
#: The time polyprof adds to the profiled loop (profiled minus unprofiled, ``added_times``) may be at
#: most ADDED_TIME_FACTOR x torch.profiler's, plus NOISE_STANDARD_ERRORS standard errors of that
#: comparison, estimated from the spread of torch's own repetitions (``added_time_limit``).
ADDED_TIME_FACTOR = 1.1
NOISE_STANDARD_ERRORS = 2.0
#: For normally distributed repetitions: standard deviation = 1.4826 x the median absolute
#: deviation, and the standard error of a median of n = 1.2533 x standard deviation / sqrt(n).
MAD_TO_SD = 1.4826
MEDIAN_SE_FACTOR = 1.2533
#: Chrome trace categories of the device rows that launch or copy (not annotations).
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
#: The slices a flow event may bind to, most specific first (a device row, then a call).
FLOW_SLICE_CATEGORIES = (*DEVICE_CATEGORIES, "cuda_sync", "cuda_runtime", "cuda_driver")


def device_name(device_type: Any) -> str:
    """``"CUDA"`` for torch's ``DeviceType.CUDA`` (a pybind enum) or polyprof's, whatever the repr."""
    name = getattr(device_type, "name", None)
    if isinstance(name, str):
        return name
    return str(device_type).rsplit(".", 1)[-1]


def summarize_profile(prof: Any, device: str = "CUDA") -> dict[str, Any]:
    """What the comparison needs of a finished profile (torch.profiler's or polyprof's, same API).

    * ``device_rows``: name -> count of ``prof.events()`` on ``device`` (kernels, copies, fills);
    * ``device_averages``: key -> count of the ``key_averages()`` rows on ``device``;
    * ``self_device``: ``"<device type>|<key>"`` -> ``self_device_time_total`` (µs) of every row
      that has some; the device type is part of the key because torch keeps rows of one name
      apart by device (Inductor's ``triton_...`` range on the CPU and its kernel on the GPU);
    * ``device_total``: the same for ``device_time_total``;
    * ``device_keys``: the ``self_device`` keys of the rows on ``device`` (the kernels themselves);
    * ``device_annotations``: ``self_device_time_total`` of the GPU-side user annotations
      (``record_function`` ranges as Kineto mirrors them on a stream, ``ProfilerStep*``). They are
      spans, not work: they include the GPU's idle gaps, which depend on how fast the CPU
      launched, so they are kept apart from ``self_device`` (torch leaves them out of its
      totals) and compared as their own class (``compared_times``);
    * ``op_counts``: key -> count of the CPU's ``aten::`` rows (a sanity check of the CPU side).

    Rows that share a key and device type (they differ in another grouping field) are summed.
    """
    events = prof.events()
    device_rows = Counter(e.name for e in events if device_name(e.device_type) == device)
    device_averages: Counter[str] = Counter()
    op_counts: Counter[str] = Counter()
    self_device: dict[str, float] = {}
    device_total: dict[str, float] = {}
    device_keys: set[str] = set()
    device_annotations: dict[str, float] = {}
    for a in prof.key_averages():
        on = device_name(a.device_type)
        key = f"{on}|{a.key}"
        if on == device:
            device_averages[a.key] += int(a.count)
        if on == "CPU" and a.key.startswith("aten::"):
            op_counts[a.key] += int(a.count)
        if on != "CPU" and getattr(a, "is_user_annotation", False):
            device_annotations[key] = device_annotations.get(key, 0.0) + float(a.self_device_time_total)
            continue
        if on == device:
            device_keys.add(key)
        if a.self_device_time_total > 0:
            self_device[key] = self_device.get(key, 0.0) + float(a.self_device_time_total)
        if a.device_time_total > 0:
            device_total[key] = device_total.get(key, 0.0) + float(a.device_time_total)
    return {
        "device_rows": dict(device_rows),
        "device_averages": dict(device_averages),
        "self_device": self_device,
        "device_total": device_total,
        "device_keys": sorted(device_keys),
        "device_annotations": device_annotations,
        "op_counts": dict(op_counts),
    }


def polyprof_reading(raw: Any, device: str = "CUDA") -> tuple[Any, Any]:
    """polyprof's reading of a torch.profiler recording: ``(results, trace)``.

    ``raw`` is torch's own raw result (``prof.profiler.kineto_results``, in
    ``on_trace_ready``); its rows are decoded as a polyprof session decodes
    the result of the same collector: the host rows by the built-in torch
    tracer, the CUDA rows by polyprof-cuda (``device`` "CUDA"), with the
    core's linking. ``results`` has ``events()`` and ``key_averages()`` as a
    profile does (``summarize_profile`` reads it); ``trace`` is what the Chrome
    exporter writes (``export_polyprof_trace``). So one recording is read both
    ways: any difference from torch's own reading of it is polyprof's
    attribution, never run-to-run timing. Call it after torch has written its
    trace of the result: before torch 2.13 polyprof also asks torch's writer
    for the result (fwdbwd flows, Kineto's args), and torch writes a result once.
    """
    from polyprof.analysis.results import ProfileResults
    from polyprof.base.activity import ProfilerActivity
    from polyprof.base.attribution import link_launches
    from polyprof.base.config import ProfileConfig
    from polyprof.base.events import concat
    from polyprof.base.trace import Trace
    from polyprof.runtime import torch_cpu
    from polyprof.runtime.torch_result import CollectorResult, DeviceRowClaims

    result = CollectorResult(raw)
    batches = []
    if device == "CUDA":
        from polyprof_cuda import kineto

        config = ProfileConfig(
            activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}, torch_activities={"CUDA"}
        )
        claims = DeviceRowClaims.of([kineto.KinetoCudaTracer()])
        host, facts = torch_cpu.decode_result(raw, config, pid=os.getpid(), claims=claims)
        batches = [host, kineto.decode_cuda_rows(result, pid=os.getpid())]
    else:
        config = ProfileConfig(activities={ProfilerActivity.CPU})
        host, facts = torch_cpu.decode_result(raw, config, pid=os.getpid())
        batches = [host]
    events = concat(link_launches(batches))
    end = int((events["start_ns"] + events["dur_ns"]).max()) if len(events) else facts["start_ns"]
    trace = Trace(events=events, config=config, start_ns=facts["start_ns"], end_ns=end, pid=os.getpid())
    return ProfileResults(traces=(trace,), use_device="cuda" if device == "CUDA" else None), trace


def export_polyprof_trace(trace: Any, path: str | os.PathLike[str]) -> str:
    """Write ``trace`` (``polyprof_reading``'s) with polyprof's Chrome exporter."""
    from polyprof.runtime.chrome_trace import ChromeTraceExporter

    return str(ChromeTraceExporter().export(trace, os.fspath(path)))


def profiler_warnings(lines: Iterable[str]) -> list[str]:
    """The warnings (``module.Category: message``, gpu_child.warning_lines) that concern the
    profilers: polyprof's own categories, and any mentioning CUPTI or Kineto."""
    return [w for w in lines if w.startswith("polyprof") or "CUPTI" in w or "Kineto" in w]


def counter_mismatches(ours: Mapping[str, int], theirs: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """name -> (ours, theirs) for every name whose counts differ (a missing name counts 0)."""
    return {
        name: (int(ours.get(name, 0)), int(theirs.get(name, 0)))
        for name in sorted(set(ours) | set(theirs))
        if int(ours.get(name, 0)) != int(theirs.get(name, 0))
    }


def median_per_key(reps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per key, the median over repetitions (a key absent from a repetition counts 0 there)."""
    keys = set().union(*reps) if reps else set()
    return {k: float(statistics.median(float(r.get(k, 0.0)) for r in reps)) for k in keys}


def relative_deviation(ours: float, theirs: float) -> float:
    """|ours - theirs| / theirs; 0 when both are 0, infinite when only theirs is 0."""
    if theirs == 0:
        return 0.0 if ours == 0 else math.inf
    return abs(ours - theirs) / abs(theirs)


def compared_times(summary: Mapping[str, Any]) -> dict[str, float]:
    """The Self CUDA per key that is compared: the work (``self_device``) and the GPU spans of
    ``record_function`` ranges (``device_annotations``), whose keys never collide (torch keeps
    annotations apart by ``is_user_annotation``, and summaries leave them out of ``self_device``)."""
    return {**summary["self_device"], **summary.get("device_annotations", {})}


def device_event_counts(summary: Mapping[str, Any]) -> dict[str, int]:
    """Events per compared key of one recording's summary (``"CUDA|<key>"`` -> count)."""
    return {f"CUDA|{key}": int(n) for key, n in summary.get("device_averages", {}).items()}


def torch_spread(
    theirs_reps: Sequence[Mapping[str, float]], again_reps: Sequence[Mapping[str, float]] = ()
) -> dict[str, float]:
    """Per key, torch's own spread in µs: the distance between the medians of its two children
    (two processes), and of each recording to its child's median, whichever is largest."""
    theirs = median_per_key(theirs_reps)
    again = median_per_key(again_reps) if again_reps else {}
    spread: dict[str, float] = {}
    for key, t in theirs.items():
        values = [abs(float(rep.get(key, 0.0)) - t) for rep in theirs_reps]
        if again_reps:
            a = again.get(key, 0.0)
            values.append(abs(a - t))
            values.extend(abs(float(rep.get(key, 0.0)) - a) for rep in again_reps)
        spread[key] = max(values, default=0.0)
    return spread


def self_device_report(
    ours_reps: Sequence[Mapping[str, float]],
    theirs_reps: Sequence[Mapping[str, float]],
    device_keys: Iterable[str],
    *,
    again_reps: Sequence[Mapping[str, float]] = (),
    range_keys: Iterable[str] = (),
    event_counts: Mapping[str, int] | None = None,
    attribution_exact: bool = False,
    tolerance: float = SELF_DEVICE_TOLERANCE,
    significant_fraction: float = SIGNIFICANT_FRACTION,
    small_tolerance: float = SMALL_KEY_TOLERANCE,
    short_event_us: float = SHORT_EVENT_US,
    short_tolerance: float = SHORT_EVENT_TOLERANCE,
    spread_factor: float = SPREAD_FACTOR,
    ceiling: float = SPREAD_CEILING,
) -> dict[str, Any]:
    """Per-key Self CUDA of ours against theirs, each the median over its repetitions, judged
    against torch's own spread.

    A key is significant when theirs is at least ``significant_fraction`` of
    their device time (the sum over ``device_keys``, the kernel rows). Each
    key's relative spread is ``torch_spread`` (with ``again_reps``, a second
    torch child's recordings: the spread from one process to the next)
    over theirs; a class's noise is the largest relative spread of its
    significant keys (classes: ``range_keys``, the GPU spans of ranges, and
    the rest; only keys present in every one of torch's recordings count
    towards it). A key may deviate ``spread_factor`` x the larger of its own
    spread and its class's noise, never less than ``tolerance`` (significant
    keys) or ``small_tolerance`` (small ones), nor than ``short_tolerance``
    for work whose events last under ``short_event_us`` on average in
    torch's recordings (``event_counts``: key -> events in one of torch's
    recordings), and never more than ``ceiling`` (significant keys:
    ``capped`` lists those whose torch spread asked for more). With
    ``attribution_exact`` (polyprof's reading of torch's own recordings
    equalled torch's), the ranges and the capped keys are judged by that
    reading, not run to run: they are listed in ``judged_by_same_recording``
    with their deviation and their spread's limit, and never failed here.

    Returns the maxima in percent (significant keys, all keys), the keys over
    their limit (``failures``: key, ours, theirs, deviation %, limit %), keys
    one side lacks, and ``noise_pct`` / ``range_noise_pct``: each class's
    noise in percent (0 with one repetition and no second child).
    """
    ours, theirs = median_per_key(ours_reps), median_per_key(theirs_reps)
    again = median_per_key(again_reps) if again_reps else {}
    ranges = set(range_keys)
    total = sum(theirs.get(k, 0.0) for k in set(device_keys))
    floor = significant_fraction * total
    spread = torch_spread(theirs_reps, again_reps)
    relative = {k: spread[k] / t for k, t in theirs.items() if t > 0}
    everywhere = (*theirs_reps, *again_reps)
    noise = {True: 0.0, False: 0.0}  # is a range -> the class's noise
    for key, r in relative.items():
        if theirs[key] >= floor and all(float(rep.get(key, 0.0)) > 0 for rep in everywhere):
            noise[key in ranges] = max(noise[key in ranges], r)
    capped: list[str] = []
    by_same_recording: list[str] = []
    counts = event_counts or {}
    significant_dev, all_dev = 0.0, 0.0
    failures: list[tuple[str, float, float, float, float]] = []
    per_key: dict[str, list[float]] = {}
    for key in sorted(relative):
        t = theirs[key]
        o = ours.get(key, 0.0)
        dev = relative_deviation(o, t)
        all_dev = max(all_dev, dev)
        significant = t >= floor
        if significant:
            significant_dev = max(significant_dev, dev)
        floor_tolerance = tolerance if significant else small_tolerance
        if key not in ranges and counts.get(key, 0) > 0 and t / counts[key] < short_event_us:
            floor_tolerance = max(floor_tolerance, short_tolerance)
        limit = max(floor_tolerance, spread_factor * max(relative[key], noise[key in ranges]))
        deferred = False
        if significant and limit > max(ceiling, floor_tolerance):
            capped.append(key)
            deferred = attribution_exact
            if not deferred:
                limit = max(ceiling, floor_tolerance)
        # A range's span in a host-bound step is the host's time per step, which each profiler's own
        # overhead sets: run to run it measures overhead, so an exact reading of the recording judges it.
        deferred = deferred or (attribution_exact and key in ranges)
        if deferred:
            by_same_recording.append(key)
        per_key[key] = [o, t, again.get(key, t), _pct(dev), _pct(limit)]
        if dev > limit and not deferred:
            failures.append((key, o, t, _pct(dev), _pct(limit)))
    return {
        "max_dev_pct": _pct(significant_dev),
        "max_dev_pct_all": _pct(all_dev),
        "noise_pct": _pct(noise[False]),
        "range_noise_pct": _pct(noise[True]),
        "significant_floor_us": floor,
        "device_time_us": total,
        "failures": failures,
        "missing": sorted(k for k, v in theirs.items() if v > 0 and ours.get(k, 0.0) == 0),
        "extra": sorted(k for k, v in ours.items() if v > 0 and theirs.get(k, 0.0) == 0),
        "ranges": sorted(ranges & set(theirs)),
        "keys": per_key,
        "capped": capped,
        "judged_by_same_recording": by_same_recording,
    }


def same_recording_report(
    torch_summaries: Sequence[Mapping[str, Any]],
    reading_summaries: Sequence[Mapping[str, Any]],
    tolerance: float = SAME_RECORDING_TOLERANCE,
) -> dict[str, Any]:
    """torch's own reading of each recording against polyprof's reading of the same raw result.

    The same events, so the device rows and the counts per key must be equal and every key's Self
    CUDA (ranges included) equal but for the order of float sums (``tolerance``, relative). Any
    difference here is polyprof's attribution, never timing. Returns the mismatches per recording.
    """
    if len(torch_summaries) != len(reading_summaries):
        raise ValueError(
            f"one reading per recording: {len(torch_summaries)} recordings, {len(reading_summaries)} readings"
        )
    rows, averages, ops, times = [], [], [], []
    max_dev = 0.0
    for rep, (t, r) in enumerate(zip(torch_summaries, reading_summaries)):
        rows.append(counter_mismatches(r["device_rows"], t["device_rows"]))
        averages.append(counter_mismatches(r["device_averages"], t["device_averages"]))
        ops.append(counter_mismatches(r["op_counts"], t["op_counts"]))
        theirs, ours = compared_times(t), compared_times(r)
        for key in sorted(set(theirs) | set(ours)):
            o, th = float(ours.get(key, 0.0)), float(theirs.get(key, 0.0))
            if math.isclose(o, th, rel_tol=tolerance, abs_tol=1e-6):
                continue
            dev = relative_deviation(o, th)
            max_dev = max(max_dev, dev)
            times.append((rep, key, o, th, _pct(dev)))
    return {
        "device_row_mismatches": rows,
        "device_average_mismatches": averages,
        "op_count_mismatches": ops,
        "time_differences": times,
        "max_dev_pct": _pct(max_dev),
        "agrees": not (any(rows) or any(averages) or any(ops) or times),
    }


def _pct(fraction: float) -> float:
    return fraction * 100 if math.isfinite(fraction) else math.inf


def overhead_ratio(profiled_s: Sequence[float], baseline_s: Sequence[float]) -> float:
    """Median profiled loop time over median unprofiled loop time."""
    if not profiled_s or not baseline_s:
        raise ValueError("overhead_ratio needs at least one timing of each")
    base = statistics.median(baseline_s)
    if base <= 0:
        raise ValueError(f"the unprofiled loop took {base} s")
    return statistics.median(profiled_s) / base


def added_times(profiled_s: Sequence[float], baseline_s: Sequence[float]) -> list[float]:
    """The time a profiler added in each repetition: its profiled loop minus the unprofiled loop of the
    same repetition (the two ran one after the other, ``gpu_child.measure_overhead``)."""
    if not profiled_s or len(profiled_s) != len(baseline_s):
        raise ValueError(
            f"added_times needs one unprofiled loop per profiled loop; got {len(profiled_s)} profiled, "
            f"{len(baseline_s)} unprofiled"
        )
    return [p - b for p, b in zip(profiled_s, baseline_s)]


def median_absolute_deviation(values: Sequence[float]) -> float:
    """The median of |value - median|: a spread that one outlying repetition does not decide."""
    if not values:
        raise ValueError("median_absolute_deviation needs at least one value")
    center = statistics.median(values)
    return float(statistics.median(abs(v - center) for v in values))


def added_time_noise(
    torch_added: Sequence[float], our_reps: int, standard_errors: float = NOISE_STANDARD_ERRORS
) -> float:
    """How far the median of ``our_reps`` added times may exceed torch's median by chance alone.

    Both medians vary from run to run; the spread of a repetition is taken from
    torch's repetitions (``MAD_TO_SD`` x their median absolute deviation), and
    the standard error of the difference of the two medians is
    ``MEDIAN_SE_FACTOR`` x that x sqrt(1/n_torch + 1/n_ours). Returns
    ``standard_errors`` of those (0 when torch's repetitions agree exactly).
    """
    if our_reps < 1:
        raise ValueError(f"our_reps must be at least 1, not {our_reps}")
    spread = MAD_TO_SD * median_absolute_deviation(torch_added)
    return standard_errors * MEDIAN_SE_FACTOR * spread * math.sqrt(1 / len(torch_added) + 1 / our_reps)


def added_time_limit(
    torch_added: Sequence[float],
    our_reps: int,
    factor: float = ADDED_TIME_FACTOR,
    standard_errors: float = NOISE_STANDARD_ERRORS,
) -> float:
    """The most time polyprof may add to the loop (the median over its ``our_reps`` repetitions):
    ``factor`` x the median of torch's added times (0 if that is negative), plus
    ``added_time_noise``."""
    torch_median = max(float(statistics.median(torch_added)), 0.0)
    return factor * torch_median + added_time_noise(torch_added, our_reps, standard_errors)


def trace_device_rows(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The device rows of a Chrome trace, by stream: ``{"by_stream": {stream: {name: count}}, ...}``.

    Reads torch's traces (Kineto's writer) and polyprof's alike: complete
    events (``ph`` X) in the kernel, memcpy and memset categories; the stream
    is ``args.stream``, else the lane (``tid``). Also counts ``ProfilerStep#``
    ranges on the host.
    """
    trace = _load_json(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_stream: dict[str, Counter[str]] = {}
    steps = 0
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if cat in DEVICE_CATEGORIES:
            args = ev.get("args") or {}
            stream = str(args.get("stream", ev.get("tid")))
            by_stream.setdefault(stream, Counter())[ev.get("name", "")] += 1
        elif str(ev.get("name", "")).startswith("ProfilerStep#") and cat != "gpu_user_annotation":
            steps += 1
    return {
        "by_stream": {s: dict(c) for s, c in sorted(by_stream.items())},
        "kernels": sum(sum(c.values()) for c in by_stream.values()),
        "profiler_steps": steps,
    }


def trace_flows(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``ac2g`` flow events of a Chrome trace (torch's, written by Kineto, or polyprof's).

    * ``events``: how many starts (``s``) and ends (``f``);
    * ``exact``: every flow event as ``[ph, id, pid, tid, ns]`` (absolute ns, read exactly from
      ``ts`` and ``baseTimeNanoseconds``), sorted: what one recording must give both ways;
    * ``arrows``: ``"<call> -> <category>:<device row>"`` -> count, for every flow end on a device
      row (kernel, copy, fill) whose start is in the trace: each launch's arrow, comparable between
      processes (the device rows are);
    * ``ends_by_slice``: ``"<category>:<name>"`` -> count of the flow ends no start reaches (Kineto
      draws one on every runtime call that launches nothing, such as ``cudaStreamIsCapturing``);
    * ``unbound``: flow events on no slice (their slice starts at another time or lane).
    """
    data = Path(path).read_bytes()
    doc = json.loads(data, parse_float=decimal.Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    base = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0

    def ns(ev: Mapping[str, Any]) -> int:
        return base + int(decimal.Decimal(ev.get("ts", 0)) * 1000)

    slices: dict[tuple[Any, Any, int], tuple[str, str]] = {}
    rank = {cat: i for i, cat in enumerate(FLOW_SLICE_CATEGORIES)}
    for ev in events:
        if ev.get("ph") != "X":
            continue
        key = (ev.get("pid"), ev.get("tid"), ns(ev))
        here = (str(ev.get("cat", "")), str(ev.get("name", "")))
        if key not in slices or rank.get(here[0], 99) < rank.get(slices[key][0], 99):
            slices[key] = here
    exact: list[list[Any]] = []
    starts: dict[int, tuple[str, str]] = {}
    ends: list[tuple[int, tuple[str, str] | None]] = []
    unbound = 0
    for ev in events:
        ph = ev.get("ph")
        if ph not in ("s", "f") or ev.get("cat") != "ac2g":
            continue
        at = ns(ev)
        exact.append([ph, int(ev.get("id", 0)), ev.get("pid"), ev.get("tid"), at])
        bound = slices.get((ev.get("pid"), ev.get("tid"), at))
        unbound += bound is None
        if ph == "s" and bound is not None:
            starts[int(ev.get("id", 0))] = bound
        elif ph == "f":
            ends.append((int(ev.get("id", 0)), bound))
    arrows: Counter[str] = Counter()
    loose: Counter[str] = Counter()
    for flow_id, bound in ends:
        if bound is None:
            continue
        start = starts.get(flow_id)
        if start is None:
            loose[f"{bound[0]}:{bound[1]}"] += 1
        elif bound[0] in DEVICE_CATEGORIES:
            arrows[f"{start[1]} -> {bound[0]}:{bound[1]}"] += 1
    return {
        "events": {"s": sum(1 for e in exact if e[0] == "s"), "f": sum(1 for e in exact if e[0] == "f")},
        "exact": sorted(exact, key=lambda e: (e[0], e[1], str(e[2]), str(e[3]), e[4])),
        "arrows": dict(arrows),
        "ends_by_slice": dict(loose),
        "unbound": unbound,
    }


def exact_flow_mismatches(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], limit: int = 20
) -> dict[str, list[list[Any]]]:
    """The flow events one trace has and the other lacks (``trace_flows``' ``exact``), at most ``limit``
    of each: empty lists when one recording's flows came out the same both ways."""
    mine = Counter(json.dumps(e) for e in ours["exact"])
    other = Counter(json.dumps(e) for e in theirs["exact"])
    return {
        "only_ours": [json.loads(e) for e in sorted((mine - other).elements())][:limit],
        "only_theirs": [json.loads(e) for e in sorted((other - mine).elements())][:limit],
    }


def stream_signature(by_stream: Mapping[str, Mapping[str, int]]) -> list[list[list[Any]]]:
    """Device rows per stream with the stream ids left out (they may differ between processes):
    each stream's sorted (name, count) pairs, the streams sorted."""
    return sorted(sorted([name, int(n)] for name, n in rows.items()) for rows in by_stream.values())


def _load_json(path: str | os.PathLike[str]) -> Any:
    data = Path(path).read_bytes()
    try:
        import orjson

        return orjson.loads(data)
    except ImportError:
        return json.loads(data)


# ---------------------------------------------------------------- one workload's numbers

PROFILERS = ("torch", "polyprof")
#: The second torch.profiler child of a workload (``--no-overhead --no-reading``): its recordings
#: against the first child's are torch's own spread from one process to the next.
TORCH_AGAIN = "torch_again"


def summarize_comparison(workload: str, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The numbers of one workload (no assertion): what the tests check and the results file keeps.

    ``runs``: the children by ``PROFILERS`` name, and optionally ``TORCH_AGAIN``. Self CUDA per key
    (work and range spans) is judged against torch's own spread (``self_device_report``); where
    the torch child read its recordings both ways, ``same_recording`` compares the two readings.
    """
    ours, theirs = runs["polyprof"], runs["torch"]
    again = runs.get(TORCH_AGAIN)
    last_theirs = theirs["summaries"][-1]
    summaries = [*ours["summaries"], *theirs["summaries"], *(again["summaries"] if again else ())]
    reading = theirs.get("reading")
    same = same_recording_report(theirs["summaries"], reading["summaries"]) if reading else None
    report = self_device_report(
        [compared_times(s) for s in ours["summaries"]],
        [compared_times(s) for s in theirs["summaries"]],
        last_theirs["device_keys"],
        again_reps=[compared_times(s) for s in again["summaries"]] if again else (),
        range_keys={k for s in summaries for k in s.get("device_annotations", {})},
        event_counts=device_event_counts(last_theirs),
        attribution_exact=bool(same and same.get("agrees")),
    )
    flows = {w: runs[w]["flows"] for w in PROFILERS if "flows" in runs[w]}
    ratios = {
        which: overhead_ratio(runs[which]["overhead"]["profiled_s"], runs[which]["overhead"]["baseline_s"])
        for which in PROFILERS
    }
    added = {
        which: added_times(runs[which]["overhead"]["profiled_s"], runs[which]["overhead"]["baseline_s"])
        for which in PROFILERS
    }
    our_reps = len(added["polyprof"])
    return {
        "record": "workload",
        "workload": workload,
        "gpu": theirs.get("facts", {}).get("gpu"),
        "steps_per_recording": ours["steps"],
        "recordings": len(ours["summaries"]),
        "device_rows": {w: sum(runs[w]["summaries"][-1]["device_rows"].values()) for w in PROFILERS},
        "distinct_device_rows": len(last_theirs["device_rows"]),
        "device_row_counts": last_theirs["device_rows"],
        "device_row_mismatches": [
            counter_mismatches(o["device_rows"], t["device_rows"])
            for o, t in zip(ours["summaries"], theirs["summaries"])
        ],
        "streams": {w: len(runs[w]["trace_rows"]["by_stream"]) for w in PROFILERS},
        "max_self_cuda_dev_pct": report["max_dev_pct"],
        "max_self_cuda_dev_pct_all_keys": report["max_dev_pct_all"],
        "torch_self_cuda_spread_pct": report["noise_pct"],
        "torch_range_spread_pct": report["range_noise_pct"],
        "torch_children": 2 if again else 1,
        "range_self_cuda": {
            key: report["keys"][key] for key in report["ranges"] if key in report["keys"]
        },  # key -> [polyprof, torch, torch again, deviation %, limit %]
        "device_time_us": report["device_time_us"],
        "self_cuda_report": report,
        "same_recording": same,
        "same_recording_flows": reading["flow_mismatches"] if reading else None,
        "flow_events": {w: f["events"] for w, f in flows.items()},
        "flow_events_of_torchs_recording_read_by_polyprof": reading["flows"]["events"] if reading else None,
        "flow_arrow_mismatches": (
            counter_mismatches(flows["polyprof"]["arrows"], flows["torch"]["arrows"])
            if len(flows) == len(PROFILERS)
            else None
        ),
        "overhead_ratio": ratios,
        "added_ms": {w: 1000 * statistics.median(added[w]) for w in PROFILERS},
        "added_ms_reps": {w: [1000 * a for a in added[w]] for w in PROFILERS},
        "added_limit_ms": 1000 * added_time_limit(added["torch"], our_reps),
        "added_noise_ms": 1000 * added_time_noise(added["torch"], our_reps),
        "loop_ms_median": {
            w: {k: 1000 * statistics.median(runs[w]["overhead"][k]) for k in ("baseline_s", "profiled_s")}
            for w in PROFILERS
        },
        "overhead_steps": ours["overhead"]["steps"],
        **start_stop_summary(runs),
        "export_s": {w: runs[w]["export_s"] for w in PROFILERS},
        "max_rss_mb": {w: runs[w]["max_rss_mb"] for w in PROFILERS},
        "polyprof_warnings": ours["warnings"],
        "graph_preinit": ours.get("graph_preinit"),
    }


def start_stop_summary(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each profiler's ``start()`` and ``stop()`` in ms: the median over the profiles after the first in
    its process (``start_ms``, ``stop_ms``) and the first's own (``first_start_ms``, which carries
    the one-time set-up). Absent from children that did not time them."""
    out: dict[str, dict[str, float]] = {"start_ms": {}, "stop_ms": {}, "first_start_ms": {}}
    for which in PROFILERS:
        timed = runs[which]["overhead"]
        for key, field in (("start_ms", "start_s"), ("stop_ms", "stop_s")):
            if timed.get(field):
                out[key][which] = 1000 * statistics.median(timed[field])
        if timed.get("first_start_s") is not None:
            out["first_start_ms"][which] = 1000 * timed["first_start_s"]
    return out


# ---------------------------------------------------------------- settings and results file


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def child_size_args() -> list[str]:
    """The recording sizes for every ``run`` child (environment overrides)."""
    return [
        "--steps", str(env_int("POLYPROF_GPU_STEPS", 50)),
        "--reps", str(env_int("POLYPROF_GPU_REPS", 3)),
        "--overhead-reps", str(env_int("POLYPROF_GPU_OVERHEAD_REPS", 7)),
        "--overhead-steps", str(env_int("POLYPROF_GPU_OVERHEAD_STEPS", 50)),
    ]  # fmt: skip


def results_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the measurements go: $POLYPROF_GPU_RESULTS, else $OUT/gpu_results.jsonl, else tmp."""
    env = os.environ if environ is None else environ
    if env.get("POLYPROF_GPU_RESULTS"):
        return Path(env["POLYPROF_GPU_RESULTS"])
    if env.get("OUT"):
        return Path(env["OUT"]) / "gpu_results.jsonl"
    return Path(tempfile.gettempdir()) / "polyprof_gpu_results.jsonl"


def write_result(record: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> Path:
    """Append ``record`` as one JSON line (infinities written as strings, keys sorted)."""
    target = Path(path) if path is not None else results_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(_finite(record), sort_keys=True) + "\n")
    return target


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def find_child_result(stdout: str, marker: str = "GPU_CHILD_RESULT ") -> dict[str, Any] | None:
    """The JSON a child printed after ``marker`` (its last such line), or None."""
    found = None
    for line in stdout.splitlines():
        if line.startswith(marker):
            found = json.loads(line[len(marker) :])
    return found


# ---------------------------------------------------------------- HTA


def hta_summary(trace_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Load the traces in ``trace_dir`` with Holistic Trace Analysis and run its kernel, temporal
    and idle-time breakdowns; what each saw of the GPU work (needs ``hta``).

    HTA 0.5's temporal breakdown fails its own ``assert non_compute_time >= 0`` on some traces (on
    an H200, on 6 of 12 that torch.profiler wrote for tests/gpu's workloads): that failure is kept
    as ``temporal_error`` (and its times as None), so the other breakdowns still count.
    """
    import warnings

    from hta.trace_analysis import TraceAnalysis

    temporal_error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = TraceAnalysis(trace_dir=str(trace_dir))
        kernel_type_df, kernel_df = analysis.get_gpu_kernel_breakdown(visualize=False)
        try:
            temporal = analysis.get_temporal_breakdown(visualize=False)
        except AssertionError as exc:
            temporal, temporal_error = None, f"AssertionError {exc}".strip()
        idle = analysis.get_idle_time_breakdown(visualize=False)
    idle_df = idle[0] if isinstance(idle, tuple) else idle
    type_sums = {str(k): float(v) for k, v in zip(kernel_type_df["kernel_type"], kernel_type_df["sum"])}
    row = temporal.iloc[0] if temporal is not None else None
    return {
        "kernel_types_us": type_sums,
        "kernel_names": sorted(str(n) for n in kernel_df["name"]),
        "compute_time_us": float(row["compute_time(us)"]) if row is not None else None,
        "non_compute_time_us": float(row["non_compute_time(us)"]) if row is not None else None,
        "idle_time_us": float(row["idle_time(us)"]) if row is not None else None,
        "temporal_error": temporal_error,
        "idle_streams": sorted({int(s) for s in idle_df["stream"]}),
    }


def hta_summary_of_file(trace: str | os.PathLike[str]) -> dict[str, Any]:
    """``hta_summary`` of one trace file alone (HTA reads every trace of a folder), or
    ``{"error": ...}`` where HTA fails on it."""
    import shutil

    with tempfile.TemporaryDirectory() as alone:
        shutil.copy(trace, Path(alone) / "rank0.json")
        try:
            return hta_summary(alone)
        except Exception as exc:  # noqa: BLE001 - the caller compares what failed where
            return {"error": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------- a readable digest of the results


def format_results(lines: Iterable[str]) -> list[str]:
    """One line per record of a results file (what scripts/gpu_check.sh prints at the end)."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line)
        kind = r.get("record")
        if kind == "machine":
            keys = ("gpu", "driver", "torch", "torch_cuda", "python", "triton", "hta")
            out.append("machine: " + ", ".join(f"{k} {r.get(k)}" for k in keys))
        elif kind == "workload" and "skipped" in r:
            out.append(f"{r['workload']}: skipped: {r['skipped']}")
        elif kind == "workload":
            ratio, added = r["overhead_ratio"], r["added_ms"]
            out.append(
                f"{r['workload']}: CUDA rows torch {r['device_rows']['torch']} / polyprof "
                f"{r['device_rows']['polyprof']} ({r['distinct_device_rows']} names, "
                f"streams {r['streams']}); "
                f"max Self CUDA deviation {_num(r['max_self_cuda_dev_pct'])}% "
                f"(all keys {_num(r['max_self_cuda_dev_pct_all_keys'])}%, "
                f"torch's own spread {_num(r['torch_self_cuda_spread_pct'])}%, ranges "
                f"{_num(r.get('torch_range_spread_pct', 0.0))}%, over {r.get('torch_children', 1)} torch "
                f"child(ren)); ranges {_ranges(r.get('range_self_cuda'))}; "
                f"torch's recording read by polyprof: {_same(r.get('same_recording'))}; "
                f"ac2g flow events torch / polyprof {_flows(r.get('flow_events'))}"
                f"{_arrows(r.get('flow_arrow_mismatches'), r.get('same_recording_flows'))}; "
                f"added ms over {r['overhead_steps']} steps torch / polyprof {_both(added)} "
                f"(limit {_num(r['added_limit_ms'])}, noise "
                f"{_num(r['added_noise_ms'])}; loop ratios {_num(ratio['torch'], 3)} / "
                f"{_num(ratio['polyprof'], 3)}); "
                f"start ms torch / polyprof {_both(r.get('start_ms'))} (first "
                f"{_both(r.get('first_start_ms'))}), stop ms {_both(r.get('stop_ms'))}"
            )
        elif kind == "hta":
            parts = []
            for which in (*PROFILERS, "torch recording written by polyprof"):
                h = r.get(which)
                if h is None:
                    continue
                parts.append(
                    f"{which}: {h['error']}"
                    if "error" in h
                    else f"{which}: kernel types {h.get('kernel_types_us')}, streams {h.get('idle_streams')}"
                    + (f", temporal breakdown: {h['temporal_error']}" if h.get("temporal_error") else "")
                )
            out.append(f"HTA {r.get('workload')}: " + "; ".join(parts))
        elif kind == "soak":
            out.append(
                f"soak: {r.get('steps')} steps, {r.get('traces')} traces in "
                f"{_num(r.get('seconds', 0), 0)} s, "
                f"{len(r.get('empty_traces', []))} without CUDA rows, CUDA rows per trace "
                f"{r.get('device_rows_min')}..{r.get('device_rows_max')}, max RSS "
                f"{_num(r.get('max_rss_mb_start', 0), 0)} -> {_num(r.get('max_rss_mb_end', 0), 0)} MB"
            )
        else:
            out.append(json.dumps(r)[:400])
    return out


def _ranges(ranges: Mapping[str, Sequence[float]] | None) -> str:
    """``key polyprof/torch µs (deviation %, limit %)`` of each range's GPU span."""
    if not ranges:
        return "none"
    return ", ".join(
        f"{key.split('|', 1)[-1]} {_num(v[0], 1)}/{_num(v[1], 1)} us ({_num(v[3])}%, limit {_num(v[4])}%)"
        for key, v in sorted(ranges.items())
    )


def _same(report: Mapping[str, Any] | None) -> str:
    if report is None:
        return "not read"
    if report.get("agrees"):
        return "equal"
    differing = len(report.get("time_differences", []))
    return f"DIFFERS (max {_num(report.get('max_dev_pct', 0.0))}%, {differing} key(s))"


def _flows(events: Mapping[str, Mapping[str, int]] | None) -> str:
    if not events:
        return "-"
    return " / ".join(
        f"{sum(events[w].values())} ({events[w].get('s', 0)} s)" if w in events else "-" for w in PROFILERS
    )


def _arrows(arrows: Mapping[str, Any] | None, same: Mapping[str, Any] | None) -> str:
    parts = []
    if arrows:
        parts.append(f"{len(arrows)} launch arrows differ")
    if same and (same.get("only_ours") or same.get("only_theirs")):
        parts.append("one recording's flows differ")
    return f" ({'; '.join(parts)})" if parts else ""


def _num(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else str(value)


def _both(values: Mapping[str, Any] | None) -> str:
    """``torch / polyprof`` of a per-profiler mapping (``-`` for one not measured)."""
    return " / ".join(_num(values[w]) if values and w in values else "-" for w in PROFILERS)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python tests/gpu/gpu_compare.py RESULTS.jsonl")
    results = Path(sys.argv[1])
    if not results.is_file():
        sys.exit(f"no results file at {results}")
    print("\n".join(format_results(results.read_text().splitlines())))
