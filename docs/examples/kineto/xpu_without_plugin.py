"""IPEX Kineto-supported profiler guide, "Add Profiler Into Script", with the XPU activity as written.

Run: ``python -m polyprof run xpu_without_plugin.py``. XPU activity is recorded by the
``polyprof-xpu`` plugin; on a machine where it cannot record, the script shows one of two outcomes:

* ``polyprof-xpu`` not installed: entering the profile raises
  ``polyprof.ActivityUnavailableError`` (a ``ValueError``) whose message names the
  distribution to install, and nothing is left running; this script prints that message:
  ``ActivityUnavailableError: ProfilerActivity.XPU needs the polyprof-xpu plugin: pip install
  polyprof-xpu``. (Installed but blocked by ``POLYPROF_PLUGINS`` or
  ``POLYPROF_DISABLE_PLUGIN_AUTOLOAD=1``, it is the same error, naming the block.)
* ``polyprof-xpu`` installed but XPU cannot be recorded here (a torch that is not an XPU build,
  no XPU device, ``IPEX_ZE_TRACING=0``, ...): the profile drops XPU with an
  ``ActivityUnavailableWarning`` on stderr, "XPU profiling is not available here (plugin 'xpu':
  <reason>); profiling continues without ProfilerActivity.XPU", and the script prints the
  CPU-only averages table.

With an Intel GPU and ``device='xpu:0'`` the table would also have the Self XPU / XPU total /
XPU time avg columns; this project has had no Intel GPU to run that on.
(torch without an XPU backend warns and profiles the CPU only.)

Adapted only where the machine has no Intel GPU: ``import intel_extension_for_pytorch`` is
dropped and ``device='xpu:0'`` became ``'cpu'``. The ``try``/``except`` around the guide's
code is added so that the example ends normally.
"""

# The guide's code is kept as written (its import order, imports and nesting).
# ruff: noqa: I001

import torch
from torch.profiler import profile, ProfilerActivity

import polyprof

input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")

try:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]) as prof:
        output_tensor_1 = torch.nonzero(input_tensor)
        output_tensor_2 = torch.unique(input_tensor)
    print(prof.key_averages().table())
except polyprof.ActivityUnavailableError as exc:
    print(f"ActivityUnavailableError: {exc}")
