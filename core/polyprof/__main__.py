"""``python -m polyprof``: the same as the ``polyprof`` command."""

from polyprof.cli import console_main

if __name__ == "__main__":
    raise SystemExit(console_main())
