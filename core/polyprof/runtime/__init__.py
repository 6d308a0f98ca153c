"""Layer 6, the runtime: what runs while a recording is in progress.

What lives here: the anyio event bus that pulls from the tracers (``bus``), a recording's
session (``session``), the one-recording-at-a-time gate (``recording``), exporting through the
exporter plugins (``exporting``), reading torch's profiler result (``torch_result``,
``result_rows``) and torch's memory timeline (``memory_timeline``).

May import: the layers below (``base`` to ``hooks``) and this folder.
"""
