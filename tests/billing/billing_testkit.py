"""Billing test kit: a scripted fleet (adapter double) and a small billing scenario.
The session fixtures that meter and rate it once live in this folder's conftest.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import polars as pl

from market_pipeline.billing.dbt_project import run_dbt, window_vars
from market_pipeline.billing.metering import HourWindow
from market_pipeline.billing.metering_source import meter_partition
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.hardware.protocol import (
    TASK_EVENT_SCHEMA,
    NodeInfo,
    ResourceClass,
    TaskInfo,
    TaskKind,
)
from market_pipeline.warehouse import Lake, Warehouse, open_warehouse

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday; 09:00 UTC is a peak hour
A100 = "A100-80GB@cn-hangzhou-a"
H800 = "H800@cn-beijing-b"
A10 = "A10@cn-hangzhou-a"
HOURS = (
    HourWindow(T0, T0 + dt.timedelta(hours=1)),
    HourWindow(T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2)),
)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def task(
    task_id: str,
    tenant: str,
    pool: str,
    gpus: int = 1,
    milli: int = 1000,
    cls: ResourceClass = ResourceClass.GUARANTEED,
    start: dt.datetime = T0,
    mem_mib: int = 0,
    mig: str | None = None,
) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tenant_id=tenant,
        pool_id=pool,
        node_id=f"node-{task_id}",
        gpu_uuids=tuple(f"GPU-{task_id}-{i}" for i in range(gpus)),
        gpu_milli=milli,
        kind=TaskKind.TRAINING,
        qos="BE",
        priority=1,
        resource_class=cls,
        started_at=start,
        mem_mib=mem_mib,
        mig_profile=mig,
    )


def events(rows: Sequence[tuple[dt.datetime, str, str, bool]]) -> pl.DataFrame:
    """Events from (ts, task_id, event, platform_fault) tuples."""
    return pl.DataFrame(
        [{"ts": ts, "task_id": t, "event": e, "reason": "", "platform_fault": f} for ts, t, e, f in rows],
        schema=TASK_EVENT_SCHEMA,
    )


class ScriptedFleet:
    """A NodeAdapter double replaying a fixed script of tasks and lifecycle events."""

    backend = "scripted"

    def __init__(self, tasks: Sequence[TaskInfo], script: pl.DataFrame, running: Sequence[str] = ()):
        self.tasks = {t.task_id: t for t in tasks}
        self.script = script
        self.running = list(running)
        self.event_reads: list[tuple[dt.datetime, dt.datetime]] = []

    def list_nodes(self) -> list[NodeInfo]:
        return []

    def list_tasks(self) -> list[TaskInfo]:
        return [self.tasks[t] for t in self.running]

    def read_task_events(self, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
        self.event_reads.append((start, end))
        return self.script.filter((pl.col("ts") >= start) & (pl.col("ts") < end))

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        return [self.tasks[t] for t in task_ids if t in self.tasks]


def scenario() -> ScriptedFleet:
    """Five tasks over 09:00-11:00 on a Monday:
    - t-full: acme, 2 whole A100 GPUs, 09:00-09:30 (the price changes at 09:10)
    - t-mig: blue, a 1g.10gb MIG slice (143 milli) of an A100, 09:15-10:20
    - t-drain: acme, half an A100, drainable, signal 10:05, drained 10:10 (billed to 10:05:10)
    - t-fault: delta, one H800 (no published price: config base), fails 09:20, platform fault
    - t-a10: cobalt, a quarter A10, from 09:30, still running
    """
    tasks = [
        task("t-full", "acme-research", A100, gpus=2, mem_mib=40960),
        task("t-mig", "blue-inference", A100, milli=143, start=at(15), mig="1g.10gb", mem_mib=10240),
        task("t-drain", "acme-research", A100, milli=500, cls=ResourceClass.DRAINABLE),
        task("t-fault", "delta-vision", H800),
        task("t-a10", "cobalt-labs", A10, milli=250, start=at(30)),
    ]
    script = events(
        [
            (T0, "t-full", "start", False),
            (at(30), "t-full", "end", False),
            (at(15), "t-mig", "start", False),
            (at(80), "t-mig", "end", False),
            (T0, "t-drain", "start", False),
            (at(65), "t-drain", "drain_signal", False),
            (at(70), "t-drain", "drained", False),
            (T0, "t-fault", "start", False),
            (at(20), "t-fault", "failed", True),
            (at(30), "t-a10", "start", False),
        ]
    )
    return ScriptedFleet(tasks, script, running=["t-a10"])


def price_book() -> pl.DataFrame:
    rows = [
        (at(-60), A100, "guaranteed", "2.400000"),
        (at(10), A100, "guaranteed", "3.000000"),
        (at(10), A100, "drainable", "1.500000"),
        (at(-60), A10, "guaranteed", "0.700000"),
    ]
    return pl.DataFrame(
        [
            {
                "effective_from": ts,
                "pool_id": pool,
                "gpu_model": pool.split("@")[0],
                "zone": pool.split("@")[1],
                "resource_class": cls,
                "price_per_gpu_hour": Decimal(price),
                "solve_id": f"solve-{i}",
                "source": "test",
            }
            for i, (ts, pool, cls, price) in enumerate(rows)
        ],
        schema_overrides={"price_per_gpu_hour": pl.Decimal(18, 6)},
    )


def build_scenario(
    path: Path, config: MarketPipelineConfig, fleet: ScriptedFleet, lake: Lake | None = None
) -> Warehouse:
    """Meter both hours into a fresh warehouse (the file at `path`, or `lake`) with the rate
    card and the price book."""
    warehouse = open_warehouse(path, lake=lake)
    refresh_rate_card(warehouse, config)
    warehouse.append("price_book", price_book())
    for window in HOURS:
        meter_partition(fleet, warehouse, config, window)
    return warehouse


def rate_hours(warehouse: Warehouse, windows: Sequence[HourWindow] = HOURS, command: str = "build") -> None:
    """The billing rollup hour by hour, as the hourly schedule runs it."""
    for window in windows:
        run_dbt(
            [
                command,
                "--select",
                "+focus_export",
                "+agg_tenant_daily_cost",
                "+agg_revenue_by_pool",
                "+agg_tenant_capacity_cost",
            ],
            warehouse.path,
            dbt_vars=window_vars(window.start, window.end),
            lake=warehouse.lake,
        )


def invoice_snapshot(warehouse: Warehouse) -> dict:
    """Everything exactly-once must preserve: invoice lines, FOCUS rows, credits, rated seconds."""
    return {
        "invoice": warehouse.query(
            "SELECT invoice_line_id, billed_cost, billed_seconds FROM fct_invoice_lines ORDER BY 1"
        ).rows(),
        "focus": warehouse.query('SELECT x_FocusRowId, "BilledCost" FROM focus_export ORDER BY 1').rows(),
        "credits": warehouse.query("SELECT credit_id, credit_amount FROM fct_sla_credits ORDER BY 1").rows(),
        "rated_seconds": warehouse.query("SELECT sum(billed_seconds) FROM fct_rated_usage").item(),
        "rated_rows": warehouse.query("SELECT count(*) FROM fct_rated_usage").item(),
    }


# A low commitment tier, so the small scenario reaches it: 5% off once a tenant has billed
# 1 GPU-hour this month (acme reaches 1.5 GPU-hours in the 09:00 hour).
LOW_TIERS = '[{"min_gpu_hours": 0, "discount": 0}, {"min_gpu_hours": 1, "discount": 0.05}]'


def assert_invoices_unchanged(warehouse: Warehouse, before: dict) -> None:
    """The warehouse's invoice totals are still `before` (an `invoice_snapshot`)."""
    after = invoice_snapshot(warehouse)
    changed = {
        k: (before.get(k), after.get(k))
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k)
    }
    assert not changed, f"invoice totals changed: {changed}"
