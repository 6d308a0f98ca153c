"""polyprof's one version; the package, the plugin manager and the build (pyproject.toml) read it."""

__version__ = "0.2.1"
