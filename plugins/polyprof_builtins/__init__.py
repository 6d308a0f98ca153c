# plugins
# polyprof first (through its plugin contract): importing polyprof installs polyprof._compat's finder,
# so that the old paths of the built-ins now in the core (polyprof_builtins.torch_cpu, ...) import.
import polyprof.plugin  # noqa: F401
