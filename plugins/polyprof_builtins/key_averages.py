"""The built-in ``key_averages`` aggregator: an adapter over ``polyprof.plugin.summarize``.

Every ``key_averages()`` table (``prof.key_averages()``,
``prof.events().key_averages()``, the legacy profile's, the autograd shim's)
asks the session's aggregator named ``key_averages``; this one, registered
``trylast``, groups the rows it is given as torch does and returns a columnar
``KeyAveragesSummary``. A plugin replaces it by returning an aggregator with
the same name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from polyprof.plugin import KEY_AVERAGES, Aggregator, Capabilities, KeyAveragesSummary, hookimpl, summarize

if TYPE_CHECKING:
    from polyprof.plugin import EventTree, ProfileConfig, Trace

__all__ = ["NAME", "KeyAverages"]

NAME = KEY_AVERAGES
_OPTIONS = ("group_by_input_shape", "group_by_stack_n", "group_by_overload_name", "include_python_functions")


class KeyAverages(Aggregator):
    """torch's ``key_averages`` of the rows it is given (``polyprof.plugin.summarize``)."""

    name = NAME

    def aggregate(
        self,
        trace: Trace,
        *,
        tree: EventTree,
        rows: np.ndarray | None = None,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
        include_python_functions: bool | None = None,
        **options: Any,
    ) -> KeyAveragesSummary:
        """Group ``rows`` of ``tree`` (all rows when None); returns a ``KeyAveragesSummary``.

        :param include_python_functions: whether python_function rows count; None: the
            installed torch's default (the results layer always passes a bool).
        :raises TypeError: an unknown option is given.
        :raises ValueError: ``group_by_stack_n`` is not an int >= 0, or ``rows`` is out of range.
        """
        if options:
            raise TypeError(
                f"unknown key_averages options {sorted(options)}; valid options: {list(_OPTIONS)}"
            )
        return summarize(
            tree,
            rows=rows,
            group_by_input_shape=group_by_input_shape,
            group_by_stack_n=group_by_stack_n,
            group_by_overload_name=group_by_overload_name,
            include_python_functions=include_python_functions,
        )


@hookimpl(trylast=True)
def polyprof_make_aggregators(config: ProfileConfig) -> list[Aggregator]:
    return [KeyAverages()]


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    return Capabilities(aggregators=(NAME,))
