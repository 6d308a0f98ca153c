"""Layer 6, the runtime: what records, and what writes a recording out.

What lives here: the anyio event bus that pulls from the tracers (``bus``), a recording's
session (``session``), the one-recording-at-a-time gate (``recording``), exporting through the
exporter plugins (``exporting``), reading torch's profiler result (``torch_result``,
``result_rows``) and torch's memory timeline (``memory_timeline``); and the essential built-in
plugins, which use these internals and so live here (as pytest keeps its essential plugins in
``_pytest``), registered through their entry points like any plugin: the CPU tracer that drives torch's
collector (``torch_cpu``, with ``own_frames``: which Python frames are polyprof's own), the "chrome"
exporter (``chrome_trace``) and the "parquet" exporter (``parquet_trace``).

May import: the layers below (``base`` to ``hooks``) and this folder.
"""
