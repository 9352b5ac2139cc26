"""Subcommands from above the domain arrive as entry points, not imports: `demo` and
`bench soak` (assets/harness/commands.py) are in the parser, and every subcommand's bad input is
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
    assert "assets.harness.commands" in names, (
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


def test_an_entry_point_left_from_an_older_install_is_one_warning_not_a_crash(monkeypatch, capsys) -> None:
    from importlib.metadata import EntryPoint

    import market_pipeline.cli as cli

    stale = EntryPoint("orchestration", "no_such_layer.commands", COMMAND_ENTRY_POINTS)
    monkeypatch.setattr(cli, "entry_points", lambda group: [stale])
    names = [m.__name__ for m in command_modules()]
    assert names == list(cli.COMMAND_MODULES)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_layer.commands" in err and "reinstall" in err


def test_an_entry_point_whose_module_fails_to_import_still_raises(monkeypatch, tmp_path) -> None:
    from importlib.metadata import EntryPoint

    import pytest

    import market_pipeline.cli as cli

    (tmp_path / "broken_layer_commands.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = EntryPoint("broken", "broken_layer_commands", COMMAND_ENTRY_POINTS)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        command_modules()
