"""``python -m polyprof``: the same as the ``polyprof`` command."""

from polyprof.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
