"""Exceptions and warnings that polyprof raises on purpose, and the exit statuses its command gives them."""

from __future__ import annotations


class PolyprofError(Exception):
    """Base class of polyprof's own errors."""


class PluginUnavailable(PolyprofError):
    """Raised by a plugin (at import, or from a hook) when it cannot run here.

    The message says why ("no CUDA driver"); ``polyprof plugins`` shows it as the
    plugin's status and the run goes on without the plugin.
    """


class PluginLoadError(PolyprofError):
    """A plugin failed to import or to register; the message names it."""


class ActivityUnavailableError(PolyprofError, ValueError):
    """An activity was asked for that no installed plugin provides."""


class PolyprofWarning(UserWarning):
    """Base class of polyprof's warnings."""


class PolyprofDeprecationWarning(PolyprofWarning, DeprecationWarning):
    """Something polyprof still accepts will go in a later release; the message says what to use instead.

    Python shows a ``DeprecationWarning`` only where ``__main__`` or a test runner triggers it.
    The messages and the release that removes each thing are in ``polyprof._compat``.
    """


class ProfilerDisabledError(PolyprofError, RuntimeError):
    """Results were asked of a profiler created with ``enabled=False``."""


#: Exit status of a usage error (argparse's), and of an input or output a command refuses.
EXIT_USAGE = 2
#: Exit status of ``polyprof diff --fail-if-slower`` when the candidate is slower past the threshold and
#: the noise: distinct from a usage error (2), so that a CI job tells a regression from a broken call.
EXIT_SLOWER = 3
#: Exit status after Ctrl-C: 128 + SIGINT, as a shell reports a command that SIGINT ended.
EXIT_INTERRUPTED = 130
