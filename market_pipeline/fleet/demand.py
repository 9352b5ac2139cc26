"""Demand per pool: requested GPUs = running + pending, on a 5-minute grid.

Running GPUs come from the metered usage intervals (exact, per second); pending GPUs from
the per-tick pool snapshots (the adapter's queue, where the backend has one), carried
forward between snapshots. Price is the guaranteed price in force, so the forecaster can
learn demand response once prices move.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.hardware.protocol import NodeInfo, NodeState, ResourceClass, TaskInfo

DEMAND_SCHEMA = {
    "pool_id": pl.Utf8,
    "ts": pl.Datetime("us", "UTC"),
    "running_gpus": pl.Float64,
    "pending_gpus": pl.Float64,
    "demand": pl.Float64,
    "price": pl.Float64,
}


def pool_snapshot(
    config: MarketPipelineConfig,
    nodes: Sequence[NodeInfo],
    tasks: Sequence[TaskInfo],
    queue: Mapping[str, Mapping[str, float]],
    ts: datetime,
) -> pl.DataFrame:
    """One row per configured pool at `ts`: running, pending and powered GPUs, and for the
    rigid guarantee the GPUs drainable tasks hold and those guaranteed jobs wait for.

    `queue` is the adapter's queue per GPU model (`pending_summary`: "gpus" asked by every
    waiting job, "guaranteed_gpus" by the guaranteed ones; empty where the backend has none).
    A queue reported per GPU model is split evenly over that model's pools."""
    pools_of_model: dict[str, list[str]] = {}
    for pool in config.pools:
        pools_of_model.setdefault(pool.gpu_model, []).append(pool.pool_id)
    rows = []
    for pool in config.pools:
        mine = [t for t in tasks if t.pool_id == pool.pool_id]
        waiting = queue.get(pool.gpu_model, {})
        share = 1.0 / len(pools_of_model[pool.gpu_model])
        gpus_on = sum(n.gpus for n in nodes if n.pool_id == pool.pool_id and n.state is NodeState.ON)
        rows.append(
            {
                "ts": ts,
                "pool_id": pool.pool_id,
                "running_gpus": float(sum(t.gpus for t in mine)),
                "pending_gpus": float(waiting.get("gpus", 0.0)) * share,
                "gpus_on": int(gpus_on),
                "drainable_running_gpus": float(
                    sum(t.gpus for t in mine if t.resource_class == ResourceClass.DRAINABLE)
                ),
                "guaranteed_pending_gpus": float(waiting.get("guaranteed_gpus", 0.0)) * share,
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "ts": pl.Datetime("us", "UTC"),
            "pool_id": pl.Utf8,
            "running_gpus": pl.Float64,
            "pending_gpus": pl.Float64,
            "gpus_on": pl.Int32,
            "drainable_running_gpus": pl.Float64,
            "guaranteed_pending_gpus": pl.Float64,
        },
    )


def running_gpus_on_grid(
    usage: pl.DataFrame, start: datetime, end: datetime, step_minutes: int = 5
) -> pl.DataFrame:
    """Mean running GPUs per pool and step from usage intervals (pool_id, started_at,
    ended_at, gpu_fraction): overlap seconds x fraction / step seconds."""
    step = timedelta(minutes=step_minutes)
    step_s = step.total_seconds()
    if usage.is_empty():
        return pl.DataFrame(
            schema={"pool_id": pl.Utf8, "ts": pl.Datetime("us", "UTC"), "running_gpus": pl.Float64}
        )
    clipped = (
        usage.select(
            "pool_id",
            pl.col("gpu_fraction").cast(pl.Float64),
            pl.max_horizontal(pl.col("started_at"), pl.lit(start)).alias("s"),
            pl.min_horizontal(pl.col("ended_at"), pl.lit(end)).alias("e"),
        )
        .filter(pl.col("e") > pl.col("s"))
        .with_columns(
            pl.datetime_ranges(
                pl.col("s").dt.truncate(f"{step_minutes}m"),
                pl.col("e"),
                interval=f"{step_minutes}m",
                closed="left",
            ).alias("bucket")
        )
        .explode("bucket")
    )
    bucket_end = pl.col("bucket") + step
    overlap = pl.min_horizontal(pl.col("e"), bucket_end) - pl.max_horizontal(pl.col("s"), pl.col("bucket"))
    return (
        clipped.with_columns((overlap.dt.total_microseconds() / 1e6).alias("overlap_s"))
        .filter(pl.col("overlap_s") > 0)
        .group_by("pool_id", "bucket")
        .agg((pl.col("overlap_s") * pl.col("gpu_fraction")).sum().truediv(step_s).alias("running_gpus"))
        .rename({"bucket": "ts"})
        .with_columns(pl.col("ts").dt.cast_time_unit("us").dt.convert_time_zone("UTC"))
    )


def demand_on_grid(
    pool_ids: Sequence[str],
    usage: pl.DataFrame,
    snapshots: pl.DataFrame,
    prices: pl.DataFrame,
    start: datetime,
    end: datetime,
    step_minutes: int = 5,
) -> pl.DataFrame:
    """The demand history table: every pool x every step in [start, end), no gaps.

    snapshots: ts, pool_id, pending_gpus; prices: effective_from, pool_id, price (guaranteed).
    """
    grid_ts = pl.datetime_range(
        start, end, interval=f"{step_minutes}m", closed="left", time_zone="UTC", eager=True
    ).dt.cast_time_unit("us")
    grid = pl.DataFrame({"pool_id": list(pool_ids)}).join(pl.DataFrame({"ts": grid_ts}), how="cross")
    running = running_gpus_on_grid(usage, start, end, step_minutes)
    out = grid.join(running, on=["pool_id", "ts"], how="left").with_columns(
        pl.col("running_gpus").fill_null(0.0)
    )
    out = _asof_by_pool(out, snapshots.select("pool_id", "ts", "pending_gpus"), "ts")
    out = _asof_by_pool(out, prices.select("pool_id", pl.col("effective_from").alias("ts"), "price"), "ts")
    return (
        out.with_columns(
            pl.col("pending_gpus").fill_null(0.0),
            (pl.col("running_gpus") + pl.col("pending_gpus").fill_null(0.0)).alias("demand"),
        )
        .select(list(DEMAND_SCHEMA))
        .cast(DEMAND_SCHEMA)
        .sort("pool_id", "ts")
    )


def _asof_by_pool(left: pl.DataFrame, right: pl.DataFrame, on: str) -> pl.DataFrame:
    if right.is_empty():
        value = [c for c in right.columns if c not in ("pool_id", on)][0]
        return left.with_columns(pl.lit(None, dtype=pl.Float64).alias(value))
    right = right.with_columns(pl.col(on).dt.cast_time_unit("us").dt.convert_time_zone("UTC")).sort(on)
    return left.sort(on).join_asof(right, on=on, by="pool_id", strategy="backward", check_sortedness=False)
