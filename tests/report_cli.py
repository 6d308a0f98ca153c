"""``polyprof report`` run in-process, for the tests of the report command (the ``report`` fixture)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest


@attrs.frozen
class CliResult:
    code: int
    out: str
    err: str


def report_runner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """``run(*args)`` runs ``polyprof report ARGS`` through ``polyprof.cli.main``, with the report
    command registered and no input-size limit taken from the environment."""
    from polyprof import cli
    from polyprof.cli.cli_report import add_report_command
    from polyprof.formats.chrome_reader import MAX_BYTES_ENV

    commands = [add for add in cli.SUBCOMMANDS if add is not add_report_command]
    monkeypatch.setattr(cli, "SUBCOMMANDS", [*commands, add_report_command])
    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)

    def run(*args: Any) -> CliResult:
        capsys.readouterr()
        code = cli.main(["report", *map(str, args)])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
