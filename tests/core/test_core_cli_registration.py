"""Subcommands from above the domain arrive as entry points, not imports: `demo` and
`bench soak` (sensors/commands.py) are in the parser, and every subcommand's bad input is
one `error:` line with exit status 2."""

from __future__ import annotations

import argparse

from market_pipeline.cli import COMMAND_ENTRY_POINTS, build_parser, command_modules, main
from market_pipeline.cli.support import INPUT_ERROR, input_error


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_the_orchestration_commands_come_from_the_entry_point_group() -> None:
    names = [m.__name__ for m in command_modules()]
    assert "sensors.commands" in names, (
        f"no {COMMAND_ENTRY_POINTS!r} entry point: reinstall the project (pip install -e . --no-deps)"
    )
    parser = build_parser()
    assert "demo" in _choices(parser)
    assert "soak" in _choices(_choices(parser)["bench"])


def test_input_error_prints_one_line_and_returns_the_bad_input_status(capsys) -> None:
    assert input_error(ValueError("no such pool 'x'")) == INPUT_ERROR == 2
    assert capsys.readouterr().err == "error: no such pool 'x'\n"


def test_a_missing_warehouse_file_for_sql_is_one_error_line(tmp_path, capsys) -> None:
    status = main(["sql", "select 1", "--warehouse", str(tmp_path / "absent.duckdb")])
    err = capsys.readouterr().err
    assert status == INPUT_ERROR
    assert err.startswith("error: ") and err.count("\n") == 1
