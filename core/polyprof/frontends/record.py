"""``record_function``: a named range in the trace, as torch's.

Recorded by torch's collector as a ``user_annotation`` event (USER_SCOPE).
It uses torch's low-level enter/exit bindings, which cost about a quarter of
``torch.autograd.profiler.record_function``'s Python path per range, and it
works as a context manager and as a decorator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class record_function:  # noqa: N801 - torch's name
    """Label a code range: ``with record_function("name"):`` or ``@record_function("name")``."""

    def __init__(self, name: str, args: str | None = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"record_function name must be a str, got {type(name).__name__}")
        self.name = name
        self.args = args
        self._handle: Any = None

    def __enter__(self) -> record_function:
        import torch

        if self.args is None:
            self._handle = torch.autograd._record_function_with_args_enter(self.name)
        else:
            self._handle = torch.autograd._record_function_with_args_enter(self.name, self.args)
        return self

    def __exit__(self, *exc_info: object) -> None:
        import torch

        handle, self._handle = self._handle, None
        if handle is not None:
            torch.autograd._record_function_with_args_exit(handle)

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with record_function(self.name, self.args):
                return func(*args, **kwargs)

        return wrapped  # type: ignore[return-value]
