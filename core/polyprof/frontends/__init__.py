"""Layer 8, the frontends: the profilers users call, and the shims behind torch's names.

What lives here: the Kineto-style ``profile`` (``profiler``, with its ``schedule`` and
``record_function``), the legacy-style profile (``legacy``), torch's autograd profile
(``autograd_profile``), ITT annotations (``itt``), the shims (``shim``, ``shim_classes``), the
checks of a profiler's arguments (``frontend_arguments``) and the results' types
(``frontend_results``). Users reach them through ``polyprof``, ``polyprof.legacy``,
``polyprof.itt`` and ``polyprof.shim``.

May import: every layer below (``base`` to ``runtime``) and this folder; never a plugin.
"""
