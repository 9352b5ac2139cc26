"""Scaling: the per-pool plan (certified capacity, gated scale-down). Its approved node
actions are carried out per tick by scaling_actions_job, launched by the scaling sensor
(sensors/scaling.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.

import dagster as dg
import polars as pl

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.drain.service import tick_budget
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.scaling.live import (
    decision_rows,
    load_memory,
    memory_frame,
    plan_fleet,
)
from market_pipeline.tick.live import next_price_ceilings, prices_in_force
from market_pipeline.tick.state import tick_origin
from market_pipeline.warehouse import readers, writers
from market_pipeline.warehouse.decisions import DecisionAction


@dg.asset(group_name="scaling", pool="warehouse", deps=[dg.AssetKey("price_book")], kinds={"duckdb"})
def scaling_plan(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Per pool: target capacity from the forecast's q90, or demand plus headroom if higher,
    and at least what the market tick's shield certified at the equilibrium price; scale-down
    only when drained, unneeded for the hysteresis period, worth it and inside the disruption
    budget. Every decision is stored with its inputs and why it was allowed or blocked
    (decisions, kind 'scale')."""
    config = fleet.config()
    adapter = fleet.get()
    now = tick_origin(adapter_now(adapter), config.loop.tick_minutes)
    store = warehouse.get()
    tick = readers.latest_tick(
        store, now
    )  # the market tick this plan sizes to: its forecast, prices, targets
    if tick.is_empty():
        raise dg.Failure(
            f"no market tick at or before {now.isoformat()}: materialise equilibrium_prices first"
        )
    memories = {p.pool_id: load_memory(store, p.pool_id) for p in config.pools}
    by_pool = {r["pool_id"]: r for r in tick.iter_rows(named=True)}
    decisions = plan_fleet(
        config,
        adapter.list_nodes(),
        adapter.list_tasks(),
        {p: (r["demand_gpus"], r["backlog_gpus"]) for p, r in by_pool.items()},
        {p: r["forecast_upper_gpus"] for p, r in by_pool.items()},
        {p: r["equilibrium_price"] for p, r in by_pool.items()},
        memories,
        readers.failed_drains_by_node(store),
        now,
        {p: r["capacity_target_gpus"] for p, r in by_pool.items()},
        next_price_ceilings(config, prices_in_force(config, store)),
        # the tick's one disruption budget: open drains count against the scaler's too
        tick_budget(store, adapter, config, wall_now=now),
    )
    rows = decision_rows(decisions, config.loop.shadow_mode, now)
    writers.record_decisions(store, rows)
    writers.write_scaler_memory(store, memory_frame(list(memories.values()), now))
    margins = {d.pool: round(d.certificate_margin, 3) for d in decisions if d.certificate_margin is not None}
    allowed = int(rows["allowed"].sum() or 0) if rows.height else 0
    acts = (
        rows.filter(pl.col("allowed") & (pl.col("action") != DecisionAction.HOLD.value))
        if rows.height
        else rows
    )
    context.log.info("scaling: %d decisions (%d allowed)", rows.height, allowed)
    return dg.MaterializeResult(
        metadata={
            ROW_COUNT: rows.height,
            "allowed": allowed,
            "node_actions": acts.height,
            "shadow_mode": config.loop.shadow_mode,
            "lowest_certificate_margin": dg.MetadataValue.float(min(margins.values()) if margins else 0.0),
            "certificate_margin_by_pool": dg.MetadataValue.json(margins),
            "decision_table": table_metadata(decision_table(rows)),
        }
    )


def decision_table(rows: pl.DataFrame) -> pl.DataFrame:
    """The plan as an operator reads it: a pool-wide decision names no node (target empty)."""
    if rows.is_empty():
        return pl.DataFrame(
            schema={
                "pool_id": pl.Utf8,
                "action": pl.Utf8,
                "node": pl.Utf8,
                "allowed": pl.Boolean,
                "count": pl.Int64,
                "reasons": pl.Utf8,
            }
        )
    return rows.select(
        "pool_id",
        "action",
        pl.col("target").fill_null("").alias("node"),
        "allowed",
        pl.col("inputs")
        .str.json_path_match("$.count")
        .cast(pl.Int64, strict=False)
        .fill_null(1)
        .alias("count"),
        pl.col("reasons").list.join("; "),
    )


scaling_assets = [scaling_plan]
