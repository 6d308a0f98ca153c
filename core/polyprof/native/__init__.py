"""Layer 2, native code: polyprof's compiled readers and the C++ sources they are built from.

What lives here: ``native_reader`` (reads torch's profiler result and Chrome trace lines through
a C++ extension built with ``torch.utils.cpp_extension``; the Python readers take over without a
compiler) and ``native_columns`` (the compiled Chrome trace column builder), beside
``kineto_reader.cpp``, ``chrome_lines.cpp`` and ``chrome_columns.cpp``.

May import: ``polyprof.base`` and this folder.
"""
