"""`market-pipeline migrate --to cluster`: an embedded warehouse (one DuckDB file) copied into
the configured DuckLake, every table's rows checked."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from market_pipeline.warehouse import Lake, open_warehouse
from market_pipeline.warehouse.decisions import DecisionKind, DecisionRow, decisions_frame
from market_pipeline.warehouse.writers import record_decisions

REPO_ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2026, 3, 2, 9, tzinfo=dt.timezone.utc)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MP__")}
    return subprocess.run(
        [sys.executable, "-m", "market_pipeline.cli", *args],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _embedded(path: Path) -> None:
    store = open_warehouse(path)
    rows = [
        DecisionRow(f"d{i}", DecisionKind.SCALE, "power_on", T0, True, False, pool_id="p") for i in range(7)
    ]
    record_decisions(store, decisions_frame(rows))
    store.append(
        "scaler_memory", pl.DataFrame({"pool_id": ["p", "q"], "memory": ["{}", "{}"], "updated_at": [T0, T0]})
    )
    with duckdb.connect(str(path)) as con:  # a table dbt built (not one of the migrations')
        con.execute("CREATE TABLE fct_example AS SELECT range AS n, 'x' || range AS label FROM range(11)")
        con.execute("CREATE VIEW v_example AS SELECT n FROM fct_example")


@pytest.mark.postgres
def test_migrate_to_cluster_copies_every_table_and_checks_the_rows(lake: Lake, tmp_path: Path):
    source = tmp_path / "warehouse.duckdb"
    _embedded(source)
    env = {
        "MP__WAREHOUSE__BACKEND": "ducklake",
        "MP__WAREHOUSE__CATALOG_URL": lake.catalog,
        "MP__WAREHOUSE__DATA_PATH": lake.data_path,
        "MP__WAREHOUSE__PATH": str(source),
    }
    done = _cli("migrate", "--to", "cluster", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    tables = report["tables"]
    assert tables["decisions"] == {"source_rows": 7, "target_rows": 7}
    assert tables["scaler_memory"] == {"source_rows": 2, "target_rows": 2}
    assert tables["fct_example"] == {"source_rows": 11, "target_rows": 11}
    assert "v_example" not in tables  # views are dbt's to rebuild
    assert all(t["source_rows"] == t["target_rows"] for t in tables.values())
    lake_store = open_warehouse(tmp_path / "unused.duckdb", migrate=False, lake=lake)
    assert lake_store.query("SELECT count(*) AS n FROM decisions WHERE kind = 'scale'")["n"][0] == 7
    again = _cli("migrate", "--to", "cluster", env=env)  # a second copy replaces, never doubles
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["tables"]["decisions"]["target_rows"] == 7


def test_migrate_to_cluster_without_a_lake_configured_is_one_clear_line(tmp_path: Path):
    done = _cli("migrate", "--to", "cluster", "--warehouse", str(tmp_path / "w.duckdb"), env={})
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "ducklake" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.postgres
def test_migrate_to_cluster_seeds_the_control_state_once(lake: Lake, tmp_path: Path):
    from market_pipeline.warehouse.control import ControlStore

    source = tmp_path / "warehouse.duckdb"
    _embedded(source)
    with duckdb.connect(str(source)) as con:
        con.execute(
            "UPDATE decisions SET executed_at = ?, outcome = 'ok: on' WHERE decision_id IN ('d0', 'd1')", [T0]
        )
        con.execute(
            "INSERT INTO drain_audit VALUES ('dr', 0, 'requested', ?, 't', 'n', 'x', '{\"phase\": \"only\"}'),"
            " ('dr', 1, 'warned', ?, 't', 'n', 'x', '{\"phase\": \"begin\"}')",
            [T0, T0],
        )
    env = {
        "MP__WAREHOUSE__BACKEND": "ducklake",
        "MP__WAREHOUSE__CATALOG_URL": lake.catalog,  # the control state defaults to this server
        "MP__WAREHOUSE__DATA_PATH": lake.data_path,
        "MP__WAREHOUSE__PATH": str(source),
        "MP__CONTROL__BACKEND": "postgres",
    }
    for _ in range(2):  # a second copy keeps, never doubles
        done = _cli("migrate", "--to", "cluster", env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["control"] == {"drain_journal": 2, "decision_claims": 2}
    control = ControlStore(lake.catalog)
    assert [(r["seq"], r["phase"]) for r in control.drain_steps("dr")] == [(0, "only"), (1, "begin")]
    assert control.claim(["d0", "d2"], "b", "run", T0, ["run"]) == {"d2"}  # d0 was carried out before
