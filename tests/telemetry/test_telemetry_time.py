"""Telemetry time: implausible timestamps quarantined; naive ones refused or converted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.lab.telemetry.synthetic import FLEET_START, fleet_samples
from market_pipeline.telemetry.ingest import ingest_samples
from market_pipeline.telemetry.rules import ValidationPolicy
from market_pipeline.warehouse import Warehouse

NOW = FLEET_START + timedelta(hours=6)


@pytest.fixture()
def warehouse(migrated_warehouse: Warehouse) -> Warehouse:
    return migrated_warehouse


def _text(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.all().cast(pl.Utf8))


def test_telemetry_time_year_one_is_quarantined_not_partitioned(warehouse: Warehouse) -> None:
    frame = _text(fleet_samples(8, nodes=1, gpus_per_node=2))
    frame = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0)
        .then(pl.lit("0001-01-01T00:00:00Z"))
        .otherwise(pl.col("ts"))
        .alias("ts")
    )
    report = ingest_samples(warehouse, frame, source="t", policy=ValidationPolicy(now=NOW))
    assert report.by_reason == {"ts:implausible": 1}
    assert report.clean == frame.height - 1
    keys = warehouse.query("SELECT DISTINCT partition_key FROM telemetry_quarantine")[
        "partition_key"
    ].to_list()
    assert all(key.startswith(str(FLEET_START.year)) for key in keys)  # not "1-01-01-00:00"


def test_telemetry_time_naive_text_and_parquet_are_refused(warehouse: Warehouse, tmp_path: Path) -> None:
    typed = fleet_samples(8, nodes=1, gpus_per_node=2)
    naive_text = _text(typed).with_columns(pl.col("ts").str.replace(r"\+00:00$", ""))
    report = ingest_samples(warehouse, naive_text, source="csv", policy=ValidationPolicy(now=NOW))
    assert report.by_reason == {"ts:naive": typed.height} and report.clean == 0
    naive_parquet = typed.with_columns(pl.col("ts").dt.replace_time_zone(None))
    report = ingest_samples(warehouse, naive_parquet, source="pq", policy=ValidationPolicy(now=NOW))
    assert report.by_reason == {"ts:naive": typed.height}
    zoned = _text(typed).with_columns(pl.col("ts").str.replace(r"\+00:00$", "Z"))
    assert (
        ingest_samples(warehouse, zoned, source="z", policy=ValidationPolicy(now=NOW)).clean == typed.height
    )


def test_telemetry_time_naive_converted_under_the_configured_zone(warehouse: Warehouse) -> None:
    typed = fleet_samples(8, nodes=1, gpus_per_node=2)
    wall = typed.with_columns(pl.col("ts").dt.replace_time_zone(None) + timedelta(hours=8))
    policy = ValidationPolicy(now=NOW + timedelta(hours=8), naive_timezone="Asia/Shanghai")  # UTC+8
    report = ingest_samples(warehouse, wall, source="sh", policy=policy)
    assert report.clean == typed.height and report.by_reason == {}
    stored = warehouse.query("SELECT min(ts) AS t FROM telemetry_clean")["t"].item()
    assert stored == typed["ts"].min()  # 08:00 in Shanghai is 00:00 UTC, not 08:00 UTC


def test_telemetry_time_naive_timezone_is_a_checked_config_key() -> None:
    from market_pipeline.config import ConfigError, load_config

    assert (
        load_config(environ={"MP__TELEMETRY__NAIVE_TIMEZONE": "Asia/Shanghai"}).telemetry.naive_timezone
        == "Asia/Shanghai"
    )
    with pytest.raises(ConfigError, match="naive_timezone"):
        load_config(environ={"MP__TELEMETRY__NAIVE_TIMEZONE": "Mars/Olympus"})
    assert datetime(2000, 1, 1, tzinfo=timezone.utc) == ValidationPolicy(now=NOW).earliest
