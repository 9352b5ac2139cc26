"""Feeds metering from the node hardware adapter and writes one partition idempotently.

Which tasks can have usage in an hour [s, e)? Those with any lifecycle event in
[s - lookback, e), those running now that started before e (they ran through e), and
those the previous partition left running (carried, with their drain signal). Only
events before e shape the intervals (see `metering.meter_window`), so a rerun gives the
same rows. Events are never read past e: the simulated adapter advances its clock to
the end of what it is asked.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from market_pipeline.billing.errors import MeteringError
from market_pipeline.billing.metering import HourWindow, meter_window
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.hardware.protocol import NodeAdapter, NodeInfo, TaskInfo
from market_pipeline.warehouse import Warehouse, WarehouseError, billing_readers, writers

DEFAULT_LOOKBACK = dt.timedelta(hours=48)


@dataclass(frozen=True)
class MeteredPartition:
    partition_key: str
    intervals: pl.DataFrame
    tasks: int
    written: int


def pool_directory(
    config: MarketPipelineConfig, nodes: Iterable[NodeInfo] = ()
) -> dict[str, tuple[str, str]]:
    """pool_id -> (gpu_model, zone) from the config, plus pools the fleet reports."""
    pools = {pool.pool_id: (pool.gpu_model, pool.zone) for pool in config.pools}
    for node in nodes:
        pools.setdefault(node.pool_id, (node.gpu_model, node.zone))
    return pools


def carried_from_previous(warehouse: Warehouse, window: HourWindow) -> dict[str, dt.datetime | None]:
    """Tasks the previous hour left running -> their drain signal time (or None)."""
    previous = HourWindow(window.start - dt.timedelta(hours=1), window.start).partition_key
    if not warehouse.exists():
        return {}
    frame = billing_readers.running_at_partition_end(warehouse, previous)
    return dict(zip(frame["task_id"].to_list(), frame["drain_signal_at"].to_list()))


def drain_records(
    warehouse: Warehouse, window: HourWindow, task_ids: Iterable[str]
) -> tuple[dict[str, dt.datetime], set[str]]:
    """Drain signals and platform faults the task-drain guardrail recorded before the
    window's end (table `drain_billing_events`); empty when that table is absent."""
    ids = sorted(set(task_ids))
    if not ids or not warehouse.exists():
        return {}, set()
    try:
        frame = billing_readers.drain_billing_records(warehouse, window.end, ids)
    except WarehouseError:
        return {}, set()  # the task-drain migration is not applied in this warehouse
    signals = {t: s for t, s, _ in frame.iter_rows() if s is not None and s < window.end}
    faults = {t for t, _, f in frame.iter_rows() if f}
    return signals, faults


def collect_tasks(
    adapter: NodeAdapter, window: HourWindow, events: pl.DataFrame, carried_ids: Iterable[str]
) -> list[TaskInfo]:
    """The catalog of every task that may have run in the window."""
    running = [t for t in adapter.list_tasks() if t.started_at < window.end]
    wanted = set(events.get_column("task_id").unique().to_list()) if events.height else set()
    wanted |= set(carried_ids)
    wanted -= {t.task_id for t in running}
    catalog = list(adapter.task_catalog(sorted(wanted))) if wanted else []
    found = {t.task_id for t in catalog}
    missing = wanted - found
    if missing:
        raise MeteringError(
            f"adapter task_catalog has no entry for task(s) {sorted(missing)[:10]}"
            f" (needed to meter partition {window.partition_key})"
        )
    return running + catalog


def meter_partition(
    adapter: NodeAdapter,
    warehouse: Warehouse,
    config: MarketPipelineConfig,
    window: HourWindow,
    lookback: dt.timedelta = DEFAULT_LOOKBACK,
) -> MeteredPartition:
    """Meter one hourly partition from the adapter and replace it in `usage_intervals`."""
    events = adapter.read_task_events(window.start - lookback, window.end)
    carried = carried_from_previous(warehouse, window)
    catalog = collect_tasks(adapter, window, events, carried)
    signals: dict[str, dt.datetime] = {k: v for k, v in carried.items() if v is not None}
    recorded_signals, faults = drain_records(warehouse, window, [t.task_id for t in catalog])
    for task_id, signal in recorded_signals.items():
        signals[task_id] = min(signal, signals.get(task_id, signal))
    pools = pool_directory(config, adapter.list_nodes())
    intervals = meter_window(events, catalog, window, pools, signals, faults)
    written = write_partition(warehouse, window.partition_key, intervals)
    return MeteredPartition(
        window.partition_key, intervals, intervals["task_id"].n_unique() if intervals.height else 0, written
    )


def write_partition(warehouse: Warehouse, partition_key: str, intervals: pl.DataFrame) -> int:
    """Delete the partition's rows and insert the new ones in one transaction (exactly once)."""
    stray = intervals.filter(pl.col("partition_key") != partition_key)
    if stray.height:
        raise MeteringError(f"{stray.height} interval(s) belong to another partition than {partition_key}")
    return writers.write_usage_partition(warehouse, partition_key, intervals)
