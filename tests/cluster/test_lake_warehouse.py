"""The warehouse on the cluster profile's DuckLake (catalog in PostgreSQL, Parquet data): the
same migrations without keys, writes that keep the keys (MERGE), and the billing dbt project
unchanged (tests/billing/test_billing_on_lake.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.warehouse import Lake, WarehouseError, open_warehouse
from market_pipeline.warehouse.schema import MIGRATIONS

pytestmark = pytest.mark.postgres
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 2, 9, tzinfo=UTC)


def test_the_lake_takes_every_migration_and_keeps_keys_by_merging(lake: Lake, tmp_path: Path):
    store = open_warehouse(tmp_path / "unused.duckdb", lake=lake)
    assert store.schema_version() == max(m.version for m in MIGRATIONS)
    assert store.migrate() == []  # a second open applies nothing
    assert not (tmp_path / "unused.duckdb").exists()
    rows = pl.DataFrame({"pool_id": ["a", "b"], "memory": ['{"n": 1}', '{"n": 2}'], "updated_at": [T0, T0]})
    store.upsert("scaler_memory", rows)
    store.upsert("scaler_memory", rows.with_columns(memory=pl.lit('{"n": 3}')).head(1))
    got = store.query("SELECT pool_id, memory FROM scaler_memory ORDER BY pool_id").rows()
    assert got == [("a", '{"n": 3}'), ("b", '{"n": 2}')]  # replaced by key, not duplicated
    history = pl.DataFrame(
        {
            "pool_id": ["a"] * 3,
            "ts": [T0 + dt.timedelta(minutes=5 * i) for i in range(3)],
            "running_gpus": [1.0, 2.0, 3.0],
            "pending_gpus": [0.0] * 3,
            "demand": [1.0, 2.0, 3.0],
            "price": [None] * 3,
        }
    )
    store.replace_where("demand_history", "pool_id = ?", ["a"], history)
    store.replace_where("demand_history", "pool_id = ?", ["a"], history.tail(2))
    assert store.query("SELECT count(*) AS n FROM demand_history")["n"][0] == 2
    assert any((tmp_path / "lake").rglob("*.parquet"))  # the data are Parquet under the data path


def test_an_unreachable_catalog_is_named_in_one_line(tmp_path: Path):
    lake = Lake("host=127.0.0.1 port=1 user=postgres dbname=nothing connect_timeout=2", f"{tmp_path}/lake/")
    with pytest.raises(WarehouseError, match="PostgreSQL"):
        open_warehouse(tmp_path / "w.duckdb", lake=lake)
