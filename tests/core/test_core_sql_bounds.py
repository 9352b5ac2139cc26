"""`sql` and `tenant-sql` bound memory, time and result size in their own child process, not
only through DuckDB's settings (DuckDB's memory limit let one string take 8 GB)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from market_pipeline.cli import main
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.isolated import run_isolated
from market_pipeline.warehouse.sql_guard import SqlLimits, SqlRefused


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlbounds") / "w.duckdb"
    open_warehouse(path)
    return path


def sleeps_through_interrupts(seconds: float, *, limits: SqlLimits, on_start) -> str:
    """A target DuckDB's interrupt cannot stop: only the caller's kill can."""
    on_start()
    time.sleep(seconds)
    return "done"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in err[0] and "panicked" not in err[0]
    return err[0]


def test_a_string_past_the_memory_limit_stops_in_the_child(warehouse: Path, capsys) -> None:
    started = time.monotonic()
    code = main(
        [
            "sql",
            "select length(repeat('x', 4000000000))",
            "--warehouse",
            str(warehouse),
            "--timeout-seconds",
            "5",
        ]
    )
    assert code == 2 and time.monotonic() - started < 8
    assert "memory" in one_error_line(capsys)


def test_rows_past_a_small_memory_limit_stop_in_the_child(warehouse: Path, capsys) -> None:
    for command in (["sql"], ["tenant-sql", "--tenant", "t1"]):
        code = main(
            [
                *command,
                "select repeat('x',100000) from range(10000)",
                "--warehouse",
                str(warehouse),
                "--memory-limit-mb",
                "64",
            ]
        )
        assert code == 2
        assert "64 MB" in one_error_line(capsys)


def test_a_query_that_ignores_its_interrupt_is_killed_at_the_limit() -> None:
    started = time.monotonic()
    with pytest.raises(SqlRefused, match="ran past the 2 s time limit"):
        run_isolated(sleeps_through_interrupts, (60.0,), SqlLimits(timeout_seconds=2))
    assert time.monotonic() - started < 2 + 3  # the kill grace, with room for a busy machine


def test_a_result_past_its_size_limit_is_refused(warehouse: Path, capsys) -> None:
    code = main(
        [
            "sql",
            "select repeat('x',1000) from range(100000)",
            "--warehouse",
            str(warehouse),
            "--max-result-mb",
            "10",
        ]
    )
    assert code == 2 and "10 MB result limit" in one_error_line(capsys)


@pytest.mark.parametrize(
    "query,names",
    [("select 'infinity'::timestamp as t", "VARCHAR"), ("select interval 1 month as i", "'i'")],
)
def test_a_value_that_cannot_be_shown_is_one_line(warehouse: Path, capsys, query: str, names: str) -> None:
    assert main(["sql", query, "--warehouse", str(warehouse)]) == 2
    assert names in one_error_line(capsys)


def test_an_ordinary_query_still_answers(warehouse: Path, capsys) -> None:
    assert main(["sql", "select 42 as x", "--warehouse", str(warehouse), "--json"]) == 0
    assert capsys.readouterr().out.strip() == '[{"x": 42}]'
