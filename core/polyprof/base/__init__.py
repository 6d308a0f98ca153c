"""Layer 1, the base: the vocabulary every other layer speaks.

What lives here: the device table and activities (``activity``), the profiling options
(``config``), polyprof's base errors and warnings (``errors``: ``PolyprofError``, ``PolyprofWarning``
and those every layer raises; an error of one layer lives with it, and those users catch are
exported from ``polyprof``), columnar event batches (``events``),
a recording's ``Trace`` (``trace``), structlog loggers (``log``), warnings aimed at the user's
line (``user_warnings``), Kineto's trace vocabulary (``kineto_format``), the time attribution
rules (``attribution``), atomic file writes (``fileio``), what the installed torch can do
(``torch_support``, ``shim_arguments``), rank and world size (``distributed``), memory events
(``_memory``) and text made safe for a terminal (``terminal``).

May import: the standard library and third-party packages (torch only inside functions), and
other modules of this folder; nothing else of polyprof.
"""
