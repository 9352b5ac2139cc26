"""Finance `sql` and `tenant-sql`: one read-only query, no host access, limits, right answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attacks import run_attacks
from hardening_kit import OTHER, TENANT, USAGE_ROWS, build_warehouse, checksum, run_cli

from market_pipeline.warehouse.sql_guard import SqlLimits, SqlRefused, check_read_only


@pytest.fixture()
def warehouse(tmp_path: Path) -> Path:
    return build_warehouse(tmp_path / "warehouse.duckdb")


@pytest.mark.slow  # some 120 attacks, each query in a spawned process
def test_hardening_attack_list_is_refused_without_a_trace(tmp_path: Path) -> None:
    counts = run_attacks(tmp_path / "attacks", timeout_seconds=1.0)
    assert counts["not_refused"] == []
    assert counts["refused"] == counts["attacks"] >= 100
    assert {
        k: counts[k]
        for k in ("tracebacks", "checksum_changes", "files_written_outside", "leaks", "ledger_rewrites")
    } == dict.fromkeys(
        ("tracebacks", "checksum_changes", "files_written_outside", "leaks", "ledger_rewrites"), 0
    )
    assert counts["replay_exit"] == 0  # the same amount again is a no-op, not an error


@pytest.mark.parametrize(
    "query",
    [
        "SELECT count(*) AS n FROM billing_ledger",
        "  with x as (select 1 as n) select n from x",
        "/* finance */ SELECT count(*) AS n FROM fct_rated_usage",
        "DESCRIBE billing_ledger",
        "SHOW TABLES",
        "(SELECT 1 AS n) UNION ALL (SELECT 2)",
    ],
)
def test_hardening_sql_runs_read_only_queries(warehouse: Path, query: str) -> None:
    code, out, err = run_cli("sql", query, "--warehouse", str(warehouse), "--json")
    assert code == 0, err
    assert json.loads(out)


def test_hardening_sql_names_the_statement_it_refuses() -> None:
    with pytest.raises(SqlRefused, match="got COPY"):
        check_read_only("COPY billing_ledger TO 'x.csv'")
    with pytest.raises(SqlRefused, match="exactly one statement is allowed, got 2"):
        check_read_only("SELECT 1; SELECT 2")
    with pytest.raises(SqlRefused, match="not PRAGMA"):
        check_read_only("PRAGMA version")
    with pytest.raises(SqlRefused, match="timeout"):
        SqlLimits(timeout_seconds=float("nan"))


def test_hardening_sql_time_and_row_limits(warehouse: Path) -> None:
    code, _, err = run_cli(
        "sql",
        "SELECT count(*) FROM range(1000000000000)",
        "--warehouse",
        str(warehouse),
        "--timeout-seconds",
        "0.5",
    )
    assert code == 2 and "time limit" in err
    code, _, err = run_cli(
        "sql", "SELECT * FROM range(50)", "--warehouse", str(warehouse), "--row-limit", "10"
    )
    assert code == 2 and "more than 10 rows" in err
    code, _, err = run_cli("sql", "SELECT 1", "--warehouse", str(warehouse), "--memory-limit-mb", "1")
    assert code == 2 and "memory limit" in err


def test_hardening_tenant_sql_answers_multi_table_queries(warehouse: Path) -> None:
    before = checksum(warehouse)
    query = "select (select count(*) from fct_rated_usage) a, (select count(*) from billing_ledger) b"
    code, out, err = run_cli("tenant-sql", "--tenant", TENANT, query, "--warehouse", str(warehouse))
    assert code == 0, err
    assert json.loads(out) == [{"a": USAGE_ROWS, "b": 1}]  # not a = 0: the first copy was lost
    code, out, _ = run_cli(
        "tenant-sql",
        "--tenant",
        OTHER,
        "SELECT DISTINCT l.tenant_id FROM billing_ledger l JOIN fct_rated_usage u USING (tenant_id)",
        "--warehouse",
        str(warehouse),
    )
    assert code == 0 and json.loads(out) == [{"tenant_id": OTHER}]
    assert checksum(warehouse) == before
