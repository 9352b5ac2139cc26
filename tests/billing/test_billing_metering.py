"""Metering: task events + task catalog -> per-second usage intervals per task, GPU and hour."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import polars as pl
import pytest
from billing_testkit import A100, HOURS, T0, at, events, scenario, task

from market_pipeline.billing.errors import MeteringError
from market_pipeline.billing.metering import HourWindow, meter_window
from market_pipeline.billing.metering_source import meter_partition, write_partition
from market_pipeline.hardware.protocol import ResourceClass
from market_pipeline.warehouse import open_warehouse

POOLS = {
    A100: ("A100-80GB", "cn-hangzhou-a"),
    "H800@cn-beijing-b": ("H800", "cn-beijing-b"),
    "A10@cn-hangzhou-a": ("A10", "cn-hangzhou-a"),
}


def meter(fleet, window):
    return meter_window(fleet.script, fleet.tasks.values(), window, POOLS)


def test_billing_intervals_per_task_gpu_and_hour_with_fractions_and_memory():
    fleet = scenario()
    first = meter(fleet, HOURS[0])
    full = first.filter(pl.col("task_id") == "t-full").sort("gpu_uuid")
    assert full.height == 2  # one interval per GPU
    assert full["gpu_fraction"].to_list() == [Decimal("1.0000")] * 2
    assert full["mem_mib"].to_list() == [20480, 20480]  # task memory split over its GPUs
    assert full["started_at"].to_list() == [T0] * 2 and full["ended_at"].to_list() == [at(30)] * 2
    assert full["end_reason"].to_list() == ["end", "end"]
    mig = first.filter(pl.col("task_id") == "t-mig").row(0, named=True)
    assert mig["gpu_fraction"] == Decimal("0.1430") and mig["mig_profile"] == "1g.10gb"
    assert (mig["started_at"], mig["ended_at"], mig["end_reason"]) == (at(15), at(60), "running")


def test_billing_intervals_clip_at_the_hour_and_close_at_drain_and_failure():
    fleet = scenario()
    second = meter(fleet, HOURS[1]).sort("task_id")
    by_task = {row["task_id"]: row for row in second.iter_rows(named=True)}
    assert set(by_task) == {"t-mig", "t-drain", "t-a10"}  # t-full and t-fault ended in hour one
    assert (by_task["t-mig"]["started_at"], by_task["t-mig"]["ended_at"]) == (at(60), at(80))
    drained = by_task["t-drain"]
    assert drained["end_reason"] == "drained" and drained["ended_at"] == at(70)
    assert drained["drain_signal_at"] == at(65)
    assert by_task["t-a10"]["ended_at"] == at(120) and by_task["t-a10"]["end_reason"] == "running"
    fault = meter(fleet, HOURS[0]).filter(pl.col("task_id") == "t-fault").row(0, named=True)
    assert fault["end_reason"] == "failed" and fault["platform_fault"] is True


def test_billing_intervals_are_whole_seconds_and_use_only_events_before_the_window_end():
    start = T0 + dt.timedelta(seconds=10, microseconds=400_000)
    fleet_tasks = [task("t-x", "acme-research", A100, start=start)]
    script = events(
        [(start, "t-x", "start", False), (T0 + dt.timedelta(hours=1, minutes=5), "t-x", "end", False)]
    )
    row = meter_window(script, fleet_tasks, HOURS[0], POOLS).row(0, named=True)
    assert row["started_at"] == T0 + dt.timedelta(seconds=10)  # floored to the second
    assert row["ended_at"] == HOURS[0].end and row["end_reason"] == "running"  # the end is later


def test_billing_drain_signal_is_carried_into_later_hours():
    fleet_tasks = [task("t-long", "acme-research", A100, cls=ResourceClass.DRAINABLE)]
    script = events([(T0, "t-long", "start", False), (at(59), "t-long", "drain_signal", False)])
    later = HourWindow(T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2))
    row = meter_window(script, fleet_tasks, later, POOLS).row(0, named=True)
    assert row["drain_signal_at"] == at(59)  # billing stops at signal + grace, rating decides


def test_billing_metering_rejects_bad_input_with_names():
    fleet = scenario()
    with pytest.raises(MeteringError, match="unknown event"):
        meter_window(events([(T0, "t-full", "paused", False)]), fleet.tasks.values(), HOURS[0], POOLS)
    with pytest.raises(MeteringError, match="t-ghost"):
        meter_window(events([(T0, "t-ghost", "start", False)]), fleet.tasks.values(), HOURS[0], POOLS)
    with pytest.raises(MeteringError, match="gpu_milli"):
        meter_window(
            fleet.script.filter(pl.col("task_id") == "t-full"),
            [task("t-full", "acme-research", A100, milli=0)],
            HOURS[0],
            POOLS,
        )
    with pytest.raises(MeteringError, match="hourly key"):
        HourWindow.from_partition_key("2026-03-02")


def test_billing_meter_partition_is_idempotent_and_survives_a_failed_write(tmp_path, billing_config):
    fleet = scenario()
    warehouse = open_warehouse(tmp_path / "warehouse.duckdb")
    first = meter_partition(fleet, warehouse, billing_config, HOURS[0])
    assert all(end <= HOURS[0].end for _, end in fleet.event_reads)  # never reads past the hour
    snapshot = warehouse.query("SELECT * FROM usage_intervals ORDER BY interval_id")
    meter_partition(fleet, warehouse, billing_config, HOURS[0])  # rerun: identical rows
    assert warehouse.query("SELECT * FROM usage_intervals ORDER BY interval_id").equals(snapshot)
    broken = first.intervals.with_columns(pl.lit("x").alias("not_a_column"))
    with pytest.raises(Exception):
        write_partition(warehouse, HOURS[0].partition_key, broken)  # crash after the delete
    assert warehouse.query("SELECT * FROM usage_intervals ORDER BY interval_id").equals(snapshot)
    meter_partition(fleet, warehouse, billing_config, HOURS[1])
    seconds = warehouse.query(
        "SELECT task_id, sum(date_diff('second', started_at, ended_at)) AS s FROM usage_intervals"
        " GROUP BY 1 ORDER BY 1"
    ).rows()
    # nothing missing or doubled across the hour boundary: 2 GPUs x 30 min, 65 min, 70 min ...
    assert dict(seconds) == {"t-full": 3600, "t-mig": 3900, "t-drain": 4200, "t-fault": 1200, "t-a10": 5400}


def test_billing_carry_over_finds_tasks_older_than_the_event_lookback(tmp_path, billing_config):
    fleet = scenario()
    warehouse = open_warehouse(tmp_path / "warehouse.duckdb")
    meter_partition(fleet, warehouse, billing_config, HOURS[0])
    fleet.running = []  # t-a10 is no longer reported running and its start is out of reach
    second = meter_partition(fleet, warehouse, billing_config, HOURS[1], lookback=dt.timedelta(0))
    assert "t-a10" in second.intervals["task_id"].to_list()  # carried from hour one
