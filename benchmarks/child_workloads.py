"""The workloads that the benchmarks' child processes profile, as source text they include.

A child script (run with ``python -c``) sets ``which`` ("torch" or "polyprof"), ``workload``
("tiny" or "convnet") and ``n_ops``, then runs ``WORKLOADS``: it imports that profiler's
``profile`` and ``ProfilerActivity`` and defines ``body()``, either ``n_ops`` calls of ``torch.add`` on
1-element tensors or ``n_ops`` training steps (forward and backward) of a small conv net.
"""

WORKLOADS = r"""
if which == "torch":
    from torch.profiler import profile, ProfilerActivity
else:
    from polyprof import profile, ProfilerActivity

if workload == "tiny":
    a = torch.ones(1); b = torch.ones(1)
    def body():
        for _ in range(n_ops):
            torch.add(a, b)
else:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 28 * 28, 10))
    x = torch.randn(8, 3, 32, 32)
    def body():
        for _ in range(n_ops):
            model(x).sum().backward()
"""
