"""The old name of ``polyprof.log``: ``get_logger`` is read from here with a deprecation warning
until polyprof 0.3.0 (``polyprof._compat``)."""

from polyprof import _compat

__getattr__ = _compat.moved_names(__name__)
