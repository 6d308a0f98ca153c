"""The workloads that the benchmarks' child processes profile, as source text they include.

A child script (run with ``python -c``) sets ``workload`` ("tiny", "convnet" or "mlp") and ``n_ops``,
then runs ``BODIES``, which defines ``body()``: ``n_ops`` calls of ``torch.add`` on 1-element tensors,
``n_ops`` training steps (forward and backward) of a small conv net, or ``n_ops`` training steps of a
small MLP (forward, loss, backward, SGD step). ``WORKLOADS`` is ``PROFILER_IMPORT`` then ``BODIES``: it
also needs ``which`` ("torch" or "polyprof") and imports that profiler's ``profile`` and
``ProfilerActivity``. bench_overhead.py runs ``BODIES`` alone, with both profilers in one process.
"""

PROFILER_IMPORT = r"""
if which == "torch":
    from torch.profiler import profile, ProfilerActivity
else:
    from polyprof import profile, ProfilerActivity
"""

BODIES = r"""
if workload == "tiny":
    a = torch.ones(1); b = torch.ones(1)
    def body():
        for _ in range(n_ops):
            torch.add(a, b)
elif workload == "mlp":
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(32, 64); y = torch.randint(0, 10, (32,))
    def body():
        for _ in range(n_ops):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
else:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 28 * 28, 10))
    x = torch.randn(8, 3, 32, 32)
    def body():
        for _ in range(n_ops):
            model(x).sum().backward()
"""

WORKLOADS = PROFILER_IMPORT + BODIES
