"""Typed writers of what the loop's steps store: one function per step's write, named for
what it records, so the assets hold no SQL (not even a WHERE fragment). Each rewrite is
idempotent: re-running a step for the same moment replaces its rows."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from market_pipeline.warehouse.store import Warehouse


def write_fleet_inventory(
    store: Warehouse,
    observed_at: datetime,
    snapshot: pl.DataFrame,
    nodes: pl.DataFrame,
    gpus: pl.DataFrame,
    tasks: pl.DataFrame,
) -> None:
    """The fleet as observed at `observed_at`: the pools' demand snapshot of that moment, the
    node and GPU inventory (replaced whole), the running tasks (upserted); tasks the adapter no
    longer lists ended when they were last seen."""
    store.replace_where("pool_demand_snapshots", "ts = ?", [observed_at], snapshot)
    store.replace_where("fleet_nodes", "true", [], nodes)
    store.replace_where("fleet_gpus", "true", [], gpus)
    store.upsert("tasks", tasks)
    store.execute(
        "UPDATE tasks SET ended_at = last_seen_at, end_reason = 'not_seen' "
        "WHERE ended_at IS NULL AND last_seen_at < ?",
        [observed_at],
    )


def write_demand_history(store: Warehouse, start: datetime, end: datetime, history: pl.DataFrame) -> int:
    """The demand grid over [start, end), replacing what that window held."""
    return store.replace_where("demand_history", "ts >= ? AND ts < ?", [start, end], history)


def write_forecasts(store: Warehouse, origin: datetime, frame: pl.DataFrame) -> int:
    """The forecasts made at `origin`."""
    return store.replace_where("demand_forecasts", "origin_ts = ?", [origin], frame)


def write_market_tick(
    store: Warehouse, tick_at: datetime, solve: pl.DataFrame, rows: pl.DataFrame, experiments: pl.DataFrame
) -> int:
    """One market tick: its solve report (appended: every solve is kept), its per-pool rows
    and its price experiments (replacing the tick's). Returns the tick rows written."""
    store.append("solve_reports", solve)
    written = store.replace_where("market_ticks", "tick_at = ?", [tick_at], rows)
    store.replace_where("price_experiments", "tick_at = ?", [tick_at], experiments)
    return written


def append_prices(store: Warehouse, rows: pl.DataFrame) -> int:
    """Prices appended to the price book as they are (the list prices before the first tick)."""
    return store.append("price_book", rows)


def publish_prices(store: Warehouse, rows: pl.DataFrame) -> int:
    """Prices effective from `rows`' (one) effective_from, replacing any published for it."""
    return store.replace_where("price_book", "effective_from = ?", [rows["effective_from"][0]], rows)


def record_tick_seconds(store: Warehouse, tick_at: datetime, seconds: float) -> None:
    """The tick's latency on its market_ticks rows: wall seconds from its run's start to its
    prices published (`/metrics` mp_tick_latency_seconds)."""
    with store.connect() as con:
        con.execute("UPDATE market_ticks SET tick_seconds = ? WHERE tick_at = ?", [seconds, tick_at])


def write_usage_partition(store: Warehouse, partition_key: str, intervals: pl.DataFrame) -> int:
    """An hour's metered usage intervals, replacing what partition `partition_key` held, in one
    transaction (a rerun meters exactly once)."""
    return store.replace_where("usage_intervals", "partition_key = ?", [partition_key], intervals)


def write_demand_response(store: Warehouse, fitted_at: datetime, rows: pl.DataFrame) -> int:
    """The demand-response fit of `fitted_at`."""
    return store.replace_where("demand_response", "fitted_at = ?", [fitted_at], rows)


def record_decisions(store: Warehouse, frame: pl.DataFrame) -> int:
    """Decisions (`warehouse.decisions.decisions_frame`), replacing any of the same id."""
    return store.upsert("decisions", frame)


def write_scaler_memory(store: Warehouse, frame: pl.DataFrame) -> int:
    """The scaler's per-pool memory, replacing each pool's."""
    return store.upsert("scaler_memory", frame)
