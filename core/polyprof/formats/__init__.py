"""Layer 3, trace formats: reading and converting traces on disk.

What lives here: the Chrome/Kineto trace reader (``chrome_reader``), the legacy profiler's JSON
array format (``legacy_trace``) and the columnar Parquet/Arrow form with the trace-suffix rules
(``columnar``).

May import: ``polyprof.base``, ``polyprof.native`` and this folder.
"""
