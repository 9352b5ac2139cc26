"""Scaling: the per-pool plan (certified capacity, gated scale-down). Its approved node
actions are carried out per tick by scaling_actions_job, launched by the scaling sensor
(sensors/scaling.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import json

import dagster as dg
import polars as pl

from assets.market import STEP_MINUTES, price_book
from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.market_state import tick_origin
from market_pipeline.scaling_live import (
    decision_rows,
    failed_drains_by_node,
    load_memory,
    memory_frame,
    plan_fleet,
)


@dg.asset(group_name="scaling", pool="warehouse", deps=[price_book], kinds={"duckdb"})
def scaling_plan(context: dg.AssetExecutionContext, fleet: FleetAdapterResource,
                 warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Per pool: target capacity from the forecast's q90, or demand plus headroom if higher,
    certified by the backlog-drainability guardrail; scale-down only when drained, unneeded for
    the hysteresis period, worth it and inside the disruption budget. Every decision is stored
    with its inputs and why it was allowed or blocked (decisions, kind 'scale')."""
    config = fleet.config()
    adapter = fleet.get()
    now = tick_origin(adapter_now(adapter), STEP_MINUTES)
    store = warehouse.get()
    demand = store.query("SELECT pool_id, arg_max(demand, ts) AS demand, arg_max(pending_gpus, ts) AS pending "
                         "FROM demand_history WHERE ts < ? GROUP BY pool_id", [now])
    q90 = store.query("SELECT pool_id, max(q90) AS q90 FROM demand_forecasts WHERE origin_ts = "
                      "(SELECT max(origin_ts) FROM demand_forecasts WHERE origin_ts <= ?) AND horizon_min <= 60 "
                      "GROUP BY pool_id", [now])
    prices = store.query("SELECT pool_id, CAST(arg_max(price_per_gpu_hour, effective_from) AS DOUBLE) AS price "
                         "FROM price_book WHERE resource_class = 'guaranteed' GROUP BY pool_id")
    memories = {p.pool_id: load_memory(store, p.pool_id) for p in config.pools}
    decisions = plan_fleet(
        config, adapter.list_nodes(), adapter.list_tasks(),
        {r["pool_id"]: (r["demand"], r["pending"]) for r in demand.iter_rows(named=True)},
        dict(q90.iter_rows()), dict(prices.iter_rows()), memories, failed_drains_by_node(store), now)
    rows = decision_rows(decisions, config.loop.shadow_mode, now)
    store.upsert("decisions", rows)
    store.upsert("scaler_memory", memory_frame(list(memories.values()), now))
    margins = {d.pool: d.certificate_margin for d in decisions if d.certificate_margin is not None}
    table = rows.select("pool_id", "action", "target", "allowed",
                        pl.col("reasons").list.join("; ")) if rows.height else rows
    context.log.info("scaling: %d decisions (%d allowed)", rows.height, int(rows["allowed"].sum() or 0))
    return dg.MaterializeResult(metadata={
        "decisions": rows.height,
        "allowed": int(rows["allowed"].sum() or 0) if rows.height else 0,
        "shadow_mode": config.loop.shadow_mode,
        "certificate_margin_by_pool": dg.MetadataValue.json(margins),
        "decision_table": dg.MetadataValue.md(table.to_pandas().to_markdown(index=False) if rows.height
                                              else "_no decisions_"),
    })


scaling_assets = [scaling_plan]
