import json
import subprocess
import sys
from datetime import datetime, timezone

import duckdb
import polars as pl
import pytest

from market_pipeline.warehouse import MIGRATIONS, Migration, Warehouse, WarehouseError, open_warehouse


def _schema_snapshot(warehouse: Warehouse) -> list[tuple]:
    return warehouse.query(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "ORDER BY table_name, column_name"
    ).rows()


def test_migrations_run_twice_without_change(tmp_path):
    warehouse = Warehouse(tmp_path / "w.duckdb")
    first = warehouse.migrate()
    assert first == sorted(m.version for m in MIGRATIONS)
    before = _schema_snapshot(warehouse)
    assert warehouse.migrate() == []
    assert _schema_snapshot(warehouse) == before
    assert warehouse.schema_version() == max(m.version for m in MIGRATIONS)


def test_migration_versions_are_unique():
    versions = [m.version for m in MIGRATIONS]
    assert len(versions) == len(set(versions))


def test_failed_migration_rolls_back_and_names_itself(tmp_path):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    broken = MIGRATIONS + (Migration(9999, "broken", ("CREATE TABLE ok_one (x INT)", "NOT SQL")),)
    with pytest.raises(WarehouseError, match=r"migration 9999 \(broken\)"):
        warehouse.migrate(broken)
    tables = warehouse.query("SELECT table_name FROM information_schema.tables")["table_name"]
    assert "ok_one" not in tables.to_list()
    assert 9999 not in warehouse.query("SELECT version FROM schema_migrations")["version"].to_list()


def test_append_and_replace_where_are_typed_and_idempotent(tmp_path):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    at = datetime(2026, 11, 1, tzinfo=timezone.utc)
    frame = pl.DataFrame(
        {
            "ts": [at, at],
            "pool_id": ["a", "b"],
            "running_gpus": [1.0, 2.0],
            "pending_gpus": [0.0, 0.5],
            "gpus_on": [8, 16],
        }
    )
    assert warehouse.append("pool_demand_snapshots", frame) == 2
    for _ in range(2):
        warehouse.replace_where(
            "pool_demand_snapshots", "pool_id = ?", ["a"], frame.filter(pl.col("pool_id") == "a")
        )
    got = warehouse.query("SELECT pool_id, gpus_on FROM pool_demand_snapshots ORDER BY pool_id")
    assert got.rows() == [("a", 8), ("b", 16)]


def test_reader_waits_for_writer_lock_instead_of_failing(tmp_path):
    path = tmp_path / "w.duckdb"
    open_warehouse(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import duckdb, time; c = duckdb.connect(%r); print('held', flush=True); time.sleep(1.5); c.close()"
            )
            % str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    got = Warehouse(path).query("SELECT count(*) AS n FROM schema_migrations")
    holder.wait(timeout=10)
    assert got["n"][0] >= 1


def test_read_only_on_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(WarehouseError, match="does not exist yet"):
        Warehouse(tmp_path / "absent.duckdb").query("SELECT 1")


def test_sql_command_prints_table_and_json(tmp_path):
    path = tmp_path / "w.duckdb"
    open_warehouse(path)
    base = [sys.executable, "-m", "market_pipeline.cli", "sql", "--warehouse", str(path)]
    out = subprocess.run(
        base + ["select count(*) as n from schema_migrations", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == [{"n": len(MIGRATIONS)}]
    table = subprocess.run(base + ["select 41 + 1 as answer"], capture_output=True, text=True, check=True)
    assert "answer" in table.stdout and "42" in table.stdout
    bad = subprocess.run(base + ["select * from no_such_table"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no_such_table" in bad.stderr


def test_sql_command_is_read_only(tmp_path):
    path = tmp_path / "w.duckdb"
    open_warehouse(path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "market_pipeline.cli",
            "sql",
            "--warehouse",
            str(path),
            "create table evil (x int)",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "read-only" in out.stderr.lower()
    with duckdb.connect(str(path), read_only=True) as con:
        names = [r[0] for r in con.execute("select table_name from information_schema.tables").fetchall()]
    assert "evil" not in names
