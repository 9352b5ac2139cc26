"""Fields a backend cannot measure: null is "not reported" for exactly the fields that backend
declares, and stays `<field>:missing` for every other source."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from market_pipeline.config import TelemetryConfig
from market_pipeline.fleet.twin_adapter import SimulatedAdapter
from market_pipeline.hardware.protocol import (
    OPTIONAL_SAMPLE_FIELDS,
    SampleCapabilityError,
    unmeasured_fields,
)
from market_pipeline.hardware.slurm.adapter import SlurmAdapter
from market_pipeline.lab.telemetry.synthetic import fleet_samples
from market_pipeline.telemetry.checks import clean_rules
from market_pipeline.telemetry.ingest import ingest_samples
from market_pipeline.telemetry.partitions import partition_window
from market_pipeline.telemetry.rules import ValidationPolicy
from market_pipeline.warehouse import Warehouse

WINDOW = partition_window("2024-01-01-00:00")
NOW = WINDOW.end + timedelta(minutes=5)
SLURM_FIELDS = unmeasured_fields(SlurmAdapter)


def allocation_samples() -> pl.DataFrame:
    """What the slurm backend delivers: allocation as utilisation, nothing it cannot measure."""
    frame = fleet_samples(60, nodes=1, gpus_per_node=4, step_seconds=240)
    return frame.with_columns(pl.lit(None, pl.Float64).alias(c) for c in sorted(SLURM_FIELDS))


@pytest.fixture()
def warehouse(migrated_warehouse: Warehouse) -> Warehouse:
    return migrated_warehouse


def test_slurm_declares_what_it_cannot_measure_and_other_backends_declare_nothing() -> None:
    assert SLURM_FIELDS == OPTIONAL_SAMPLE_FIELDS == {"mem_used_mib", "power_w", "temp_c"}
    assert unmeasured_fields(SimulatedAdapter) == frozenset()

    class Boasting:
        backend = "boasting"
        unmeasured_sample_fields = frozenset({"power_w", "sm_util_pct"})

    with pytest.raises(SampleCapabilityError, match="boasting adapter declares sm_util_pct unmeasured"):
        unmeasured_fields(Boasting())


def test_not_reported_fields_are_clean_only_for_the_backend_that_declares_them(warehouse: Warehouse) -> None:
    frame = allocation_samples()
    strict = ingest_samples(
        warehouse, frame, source="strict", policy=ValidationPolicy(now=NOW, window=WINDOW)
    )
    assert strict.clean == 0 and strict.by_reason == {
        "mem_used_mib:missing": 60,
        "power_w:missing": 60,
        "temp_c:missing": 60,
    }
    declared = ValidationPolicy(now=NOW, window=WINDOW, unmeasured=SLURM_FIELDS)
    report = ingest_samples(warehouse, frame, source="adapter", policy=declared)
    assert (report.clean, report.quarantined) == (60, 0)
    stored = warehouse.query("SELECT power_w, temp_c, mem_used_mib, sm_util_pct FROM telemetry_clean")
    assert stored.height == 60 and stored["power_w"].null_count() == 60
    assert stored["sm_util_pct"].null_count() == 0

    # a value in a declared field is still checked; the fields every backend measures still must be there
    spoiled = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(-5.0).otherwise(pl.col("power_w")).alias("power_w"),
        pl.when(pl.int_range(pl.len()) == 1).then(None).otherwise(pl.col("sm_util_pct")).alias("sm_util_pct"),
        pl.when(pl.int_range(pl.len()) == 2)
        .then(None)
        .otherwise(pl.col("mem_total_mib"))
        .alias("mem_total_mib"),
    )
    again = ingest_samples(warehouse, spoiled, source="adapter", policy=declared)
    assert again.by_reason == {
        "power_w:out_of_range": 1,
        "sm_util_pct:missing": 1,
        "mem_total_mib:missing": 1,
    }


def test_the_stored_rules_allow_null_only_in_the_declared_fields(warehouse: Warehouse) -> None:
    declared = ValidationPolicy(now=NOW, window=WINDOW, unmeasured=SLURM_FIELDS)
    ingest_samples(warehouse, allocation_samples(), source="adapter", policy=declared)
    telemetry = TelemetryConfig()
    assert clean_rules(warehouse, WINDOW.key, telemetry, NOW, SLURM_FIELDS).passed
    strict = clean_rules(warehouse, WINDOW.key, telemetry, NOW)
    failed = {(r.expectation, r.column) for r in strict.failed}
    assert failed == {
        ("expect_column_values_to_not_be_null", "mem_used_mib"),
        ("expect_column_values_to_not_be_null", "power_w"),
        ("expect_column_values_to_not_be_null", "temp_c"),
    }


def test_an_hour_without_samples_passes_the_stored_rules(warehouse: Warehouse) -> None:
    """The first hour of a live loop on a fresh adapter can be empty: freshness warns about
    it, the blocking rules have nothing to fail (the newest-timestamp rule read NaT)."""
    report = clean_rules(warehouse, WINDOW.key, TelemetryConfig(), NOW, SLURM_FIELDS)
    assert report.passed and report.rows == 0, report.markdown()
