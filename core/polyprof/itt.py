"""Intel ITT (VTune) annotations with ``torch.profiler.itt``'s API, public path: ``polyprof.itt``.

A public namespace in the style of ``pytest`` over ``_pytest``: it defines nothing, and each name's
one home is ``polyprof.frontends.itt``.
"""

from polyprof.frontends.itt import (
    emit_itt,
    is_available,
    mark,
    range,  # noqa: A004 - torch.profiler.itt's name
    range_pop,
    range_push,
)

__all__ = [
    "emit_itt",
    "is_available",
    "mark",
    "range",
    "range_pop",
    "range_push",
]
