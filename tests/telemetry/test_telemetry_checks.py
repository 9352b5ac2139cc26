"""Partition checks: great-expectations rules on stored clean rows, rates, accounting, freshness."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from market_pipeline.config import TelemetryConfig
from market_pipeline.lab.telemetry.synthetic import fleet_samples
from market_pipeline.telemetry.checks import (
    accounting,
    clean_rules,
    evaluate_partition,
    freshness,
    quarantine_rate_verdict,
    quarantine_stats,
    reasons_markdown,
)
from market_pipeline.telemetry.ingest import ingest_samples
from market_pipeline.telemetry.partitions import partition_window
from market_pipeline.telemetry.rules import ValidationPolicy
from market_pipeline.warehouse import Warehouse

WINDOW = partition_window("2024-01-01-00:00")
NOW = WINDOW.end + timedelta(minutes=5)
TELEMETRY = TelemetryConfig()


@pytest.fixture()
def warehouse(migrated_warehouse: Warehouse) -> Warehouse:
    store = migrated_warehouse
    frame = fleet_samples(16 * 60, nodes=2, gpus_per_node=8)
    spoiled = frame.with_columns(
        pl.when(pl.int_range(pl.len()) < 12).then(float("nan")).otherwise(pl.col("power_w")).alias("power_w")
    )
    ingest_samples(store, spoiled, source="adapter", policy=ValidationPolicy(now=NOW, window=WINDOW))
    return store


def inject_clean_row(store: Warehouse, **changes: object) -> None:
    """Write behind validation's back, as a defect or another writer would."""
    row = store.query("SELECT * FROM telemetry_clean LIMIT 1")
    store.append(
        "telemetry_clean",
        row.with_columns([pl.lit(v).cast(row.schema[k]).alias(k) for k, v in changes.items()]),
    )


# great-expectations costs seconds per run: the tests below run it three times in all.
def test_telemetry_rules_catch_rows_that_bypassed_validation(warehouse: Warehouse) -> None:
    inject_clean_row(warehouse, sm_util_pct=140.0)
    inject_clean_row(warehouse, power_w=float("inf"), ts=WINDOW.start + timedelta(seconds=7))
    inject_clean_row(warehouse, gpu_uuid="GPU-not-in-fleet", ts=WINDOW.start + timedelta(seconds=1))
    report = clean_rules(warehouse, WINDOW.key, TELEMETRY, NOW)
    failed = {(r.expectation, r.column) for r in report.failed}
    assert failed == {
        ("expect_column_values_to_be_between", "sm_util_pct"),
        ("expect_column_values_to_be_between", "power_w"),
        ("expect_compound_columns_to_be_unique", "node_id,gpu_uuid,ts"),
    }  # no inventory yet: unknown GPUs are not a failure
    assert "NO" in report.markdown()


def test_telemetry_rules_check_the_inventory_when_one_exists(warehouse: Warehouse) -> None:
    inject_clean_row(warehouse, gpu_uuid="GPU-not-in-fleet", ts=WINDOW.start + timedelta(seconds=1))
    uuids = warehouse.query(
        "SELECT DISTINCT gpu_uuid FROM telemetry_clean WHERE gpu_uuid <> 'GPU-not-in-fleet'"
    ).get_column("gpu_uuid")
    warehouse.append(
        "fleet_gpus",
        pl.DataFrame(
            {
                "gpu_uuid": uuids,
                "node_id": "n",
                "gpu_index": 0,
                "gpu_model": "H800",
                "memory_total_mib": 81920,
                "observed_at": NOW,
            },
            schema_overrides={"gpu_index": pl.Int32, "memory_total_mib": pl.Int32},
        ),
    )
    report = clean_rules(warehouse, WINDOW.key, TELEMETRY, NOW)
    (failed,) = report.failed
    assert failed.column == "inventory_gpu_uuid" and failed.unexpected == 1


def test_telemetry_quarantine_rate_verdicts_follow_the_thresholds(warehouse: Warehouse) -> None:
    stats = quarantine_stats(warehouse, WINDOW.key)
    assert (stats.rows_in, stats.quarantined) == (960, 12)
    assert stats.by_reason == {"power_w:not_finite": 12}
    assert quarantine_rate_verdict(stats, 0.05).passed  # 1.25 % under the block threshold
    warn = quarantine_rate_verdict(stats, 0.005)
    assert not warn.passed and "12 of 960" in warn.description
    never = quarantine_rate_verdict(quarantine_stats(warehouse, "2024-01-01-05:00"), 0.05)
    assert not never.passed and "not been ingested" in never.description
    assert "power_w:not_finite | 12" in reasons_markdown(stats.by_reason)


def test_telemetry_accounting_detects_lost_rows(warehouse: Warehouse) -> None:
    assert accounting(warehouse, WINDOW.key).passed
    warehouse.execute("DELETE FROM telemetry_quarantine WHERE source_row = 1")
    result = accounting(warehouse, WINDOW.key)
    assert not result.passed and (result.rows_in, result.quarantined_rows) == (960, 11)


def test_telemetry_freshness_compares_the_newest_clean_sample(warehouse: Warehouse) -> None:
    fresh = freshness(warehouse, NOW, timedelta(minutes=30))
    assert fresh.passed and fresh.latest_partition == WINDOW.key
    stale = freshness(warehouse, NOW + timedelta(hours=2), timedelta(minutes=30))
    assert not stale.passed and "min old" in stale.description


def test_telemetry_evaluate_partition_bundles_every_check(warehouse: Warehouse) -> None:
    result = evaluate_partition(warehouse, WINDOW.key, TELEMETRY, NOW)
    summary = result.summary()
    assert result.rules.passed, result.rules.markdown()
    assert result.rules.rows == 16 * 60 - 12 and len(result.rules.rules) >= 20
    assert result.passed and summary["quarantine_warn"]["passed"] is False
    assert summary["accounting"] == {"passed": True, "rows_in": 960, "clean": 948, "quarantined": 12}
