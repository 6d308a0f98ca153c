"""Whether polyprof-xpu can record XPU in this process, and why not: only through torch's Kineto.

* **kineto**: torch is an XPU build (``torch.version.xpu``). Its Kineto owns
  Intel PTI in the process, so polyprof asks torch's collector for
  ``ProfilerActivity.XPU`` and decodes the XPU rows of its result
  (``polyprof_xpu.kineto``).
* **None**: torch is absent or not an XPU build. Nothing in the process can
  record XPU then; the reason names the fix. polyprof has no PTI tracer of
  its own (docs/xpu.md, "Why there is no direct PTI mode").

Deciding never imports torch or initialises a device: torch's build is read
from its package files (``polyprof.plugin.installed_build``).
"""

from __future__ import annotations

from typing import Literal

import attrs

from polyprof.plugin import TorchBuild

KINETO: Literal["kineto"] = "kineto"
_INSTALL_XPU_TORCH = (
    "install an XPU build of torch (polyprof-xpu records XPU only through it, see docs/xpu.md)"
)


@attrs.frozen
class XpuMode:
    """The mode, or None with the reason XPU cannot be recorded here."""

    kind: Literal["kineto"] | None
    #: For a mode, what ``polyprof plugins`` shows; else why XPU is unavailable.
    detail: str


def choose_mode(torch_build: TorchBuild | None) -> XpuMode:
    """The mode for ``torch_build`` (None: torch is not installed)."""
    if torch_build is None:
        return XpuMode(None, f"torch is not installed: {_INSTALL_XPU_TORCH}")
    if not torch_build.xpu:
        return XpuMode(
            None,
            f"torch {torch_build.version} is not an XPU build: torch's Kineto cannot record XPU here; "
            + _INSTALL_XPU_TORCH,
        )
    return XpuMode(KINETO, f"via torch's Kineto (torch {torch_build.version}, XPU {torch_build.xpu})")
