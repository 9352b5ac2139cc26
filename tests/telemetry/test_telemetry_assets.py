"""The Dagster `telemetry_samples` asset and its checks, with a fake adapter resource."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl

from assets.lib.partitions import HOURLY_PARTITIONS
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.telemetry.assets import telemetry_assets, telemetry_samples
from assets.telemetry.checks import telemetry_checks, telemetry_quarantine_rate_blocking
from market_pipeline.hardware.protocol import empty_samples
from market_pipeline.lab.telemetry.synthetic import fleet_samples
from market_pipeline.telemetry.partitions import partition_window

WINDOW = partition_window("2024-01-01-00:00")


class FakeAdapter:
    """Returns a prepared frame, like an adapter whose nodes reported it."""

    backend = "fake"

    def __init__(self, frame: pl.DataFrame, error: str | None = None) -> None:
        self.frame = frame
        self.last_error = error

    def now(self) -> datetime:
        return WINDOW.end + timedelta(minutes=2)

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        return self.frame.filter((pl.col("ts") >= start) & (pl.col("ts") < end))


ADAPTERS: dict[str, FakeAdapter] = {}


class FakeFleet(FleetAdapterResource):
    name: str = "default"

    def get(self) -> FakeAdapter:
        return ADAPTERS[self.name]


def spoiled(share_rows: int) -> pl.DataFrame:
    frame = fleet_samples(16 * 60, nodes=2, gpus_per_node=8)
    return frame.with_columns(
        pl.when(pl.int_range(pl.len()) < share_rows).then(-1.0).otherwise(pl.col("temp_c")).alias("temp_c")
    )


def run(tmp_path: Path, name: str, selection: list) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        selection,
        partition_key=WINDOW.key,
        raise_on_error=False,
        resources={
            "fleet": FakeFleet(name=name),
            "warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb")),
        },
    )


def test_telemetry_asset_writes_the_partition_and_reports_for_the_operator(tmp_path: Path) -> None:
    ADAPTERS["few_bad"] = FakeAdapter(spoiled(share_rows=10))
    result = run(tmp_path, "few_bad", [*telemetry_assets, *telemetry_checks])
    assert result.success
    (materialization,) = result.asset_materializations_for_node("telemetry_samples")
    metadata = materialization.metadata
    assert (metadata["rows_in"].value, metadata["clean"].value, metadata["quarantined"].value) == (
        960,
        950,
        10,
    )
    reasons = metadata["quarantine_reasons"]  # a table with its schema, not Markdown
    assert [c.name for c in reasons.schema.columns] == ["reason", "rows"]
    assert {"reason": "temp_c:out_of_range", "rows": 10} in [r.data for r in reasons.records]
    assert metadata["dagster/row_count"].value == 950
    assert metadata["utilisation_heatmap"].value.startswith("![SM utilisation](data:image/png;base64,")
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(checks) == {c.check_key.name for c in telemetry_checks}
    assert checks["telemetry_quarantine_rate_blocking"].passed
    assert not checks["telemetry_quarantine_rate_warning"].passed  # 1 % > 0.5 %
    assert checks["telemetry_quarantine_rate_warning"].severity is dg.AssetCheckSeverity.WARN
    assert checks["telemetry_accounting"].passed
    assert checks["telemetry_clean_rules"].passed
    assert checks["telemetry_freshness"].passed

    again = run(tmp_path, "few_bad", telemetry_assets)  # re-materialise: replaces, no duplicates
    assert again.success
    store = WarehouseResource(path=str(tmp_path / "w.duckdb")).reader()
    assert store.query("SELECT count(*) FROM telemetry_clean").item() == 950
    assert store.query("SELECT count(*) FROM telemetry_quarantine").item() == 10


def test_telemetry_blocking_check_fails_a_partition_over_the_threshold(tmp_path: Path) -> None:
    ADAPTERS["many_bad"] = FakeAdapter(spoiled(share_rows=100))  # 10 % > 5 %
    result = run(tmp_path, "many_bad", [telemetry_samples, telemetry_quarantine_rate_blocking])
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.severity is dg.AssetCheckSeverity.ERROR
    assert "100 of 960" in evaluation.description


def test_telemetry_adapter_failure_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    ADAPTERS["broken"] = FakeAdapter(empty_samples(), error="cannot scrape http://x/metrics")
    result = run(tmp_path, "broken", telemetry_assets)
    assert not result.success
    failure = result.get_step_failure_events()[0]
    assert "cannot scrape http://x/metrics" in str(failure.event_specific_data.error)


def test_telemetry_partitions_are_hourly_and_shared() -> None:
    assert isinstance(HOURLY_PARTITIONS, dg.HourlyPartitionsDefinition)
    from market_pipeline.fleet.history import configured_history_start

    assert HOURLY_PARTITIONS.get_first_partition_key() == configured_history_start().strftime(
        "%Y-%m-%d-%H:%M"
    )
    assert telemetry_samples.partitions_def == HOURLY_PARTITIONS
