"""The legacy profiler, public path: ``polyprof.legacy.profile`` (torch's, with IPEX's ``use_xpu``).

A public namespace in the style of ``pytest`` over ``_pytest``: it defines nothing; the profile's
home is ``polyprof.frontends.legacy``, ``ProfilerDisabledError``'s ``polyprof.base.errors``. Scripts
import it from here::

    with polyprof.legacy.profile(use_xpu=True) as prof:
        ...
"""

from polyprof.base.errors import ProfilerDisabledError
from polyprof.frontends.legacy import LegacyEventList, profile

__all__ = [
    "LegacyEventList",
    "ProfilerDisabledError",
    "profile",
]
