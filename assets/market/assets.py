"""The market slice of the control loop: demand history -> forecast -> equilibrium prices ->
price book. Each asset reads the warehouse, calls the domain and writes one table."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from datetime import datetime, timedelta, timezone

import dagster as dg
import polars as pl

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.market.checks import FORECAST_CHECK_SPECS, forecast_check_results
from market_pipeline.demand_response.live import run_experiments, tick_response_observed
from market_pipeline.fleet.demand import demand_on_grid
from market_pipeline.forecast.operator import operator_metadata, operator_rows
from market_pipeline.forecast.plotting import plot_forecast_png
from market_pipeline.forecast.pools import busiest_pools, forecast_pool_results, results_frame, summary_rows
from market_pipeline.forecast.settings import FORECASTER_VERSION
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.report.plots import lines_png, png_markdown
from market_pipeline.tick import Promises, run_market_tick
from market_pipeline.tick.live import (
    base_price_rows,
    pool_tick_inputs,
    prices_in_force,
    published_rows,
    tick_rows,
)
from market_pipeline.tick.pricing import build_market_problem, solver_settings
from market_pipeline.tick.state import (
    FORECAST_HORIZON_MIN,
    GRID_MINUTES,
    global_resolve_due,
    shadow_price_decisions,
    solve_record,
    tick_origin,
)
from market_pipeline.warehouse import readers, writers

HISTORY_DAYS = 3
BASE_PRICES_FROM = datetime(2024, 1, 1, tzinfo=timezone.utc)
FLEET_INVENTORY = dg.AssetKey("fleet_inventory")


@dg.asset(
    group_name="market",
    pool="warehouse",
    deps=[FLEET_INVENTORY, dg.AssetKey("usage_intervals")],
    kinds={"duckdb", "polars"},
)
def demand_history(fleet: FleetAdapterResource, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Requested GPUs (running + pending) per pool on a 5-minute grid over the last days,
    with the guaranteed price in force at each step."""
    config = fleet.config()
    end = tick_origin(adapter_now(fleet.get()), GRID_MINUTES)
    start = end - timedelta(days=HISTORY_DAYS)
    store = warehouse.get()
    usage = readers.usage_overlapping(store, start, end)
    history = demand_on_grid(
        [p.pool_id for p in config.pools],
        usage,
        readers.pending_snapshots_before(store, end),
        readers.guaranteed_prices_before(store, end),
        start,
        end,
        GRID_MINUTES,
    )
    writers.write_demand_history(store, start, end, history)
    latest = history.filter(pl.col("ts") == history["ts"].max())
    return dg.MaterializeResult(
        metadata={
            "window": dg.MetadataValue.text(f"{start.isoformat()} .. {end.isoformat()}"),
            ROW_COUNT: history.height,
            "usage_intervals_read": usage.height,
            "demand_gpus_now": dg.MetadataValue.float(round(float(latest["demand"].sum() or 0.0), 3)),
            "latest_demand": table_metadata(latest),
        }
    )


@dg.asset(
    group_name="market",
    pool="warehouse",
    deps=[demand_history],
    kinds={"sklearn", "duckdb"},
    check_specs=FORECAST_CHECK_SPECS,
)
def demand_forecast(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Per pool: the chosen forecaster (never worse than persistence on validation), q10/q50/q90
    for the next hour in 5-minute steps and a coarse 24 h curve; model and version recorded."""
    store = warehouse.get()
    origin = tick_origin(adapter_now(fleet.get()), GRID_MINUTES)
    demand = readers.demand_history_before(store, origin)
    if demand.is_empty():
        raise dg.Failure("demand_history is empty: materialise telemetry and usage first")
    results = forecast_pool_results(demand, step_minutes=GRID_MINUTES, origin_ts=origin)
    frame = results_frame(results, demand.schema["ts"])
    writers.write_forecasts(store, origin, frame)
    operator = operator_metadata(results)  # rolling coverage and how each model was chosen
    operator.pop("forecast_operator_table")  # the same rows as a table below
    metadata: dict[str, object] = {
        "origin": dg.MetadataValue.text(origin.isoformat()),
        "pools": len(results),
        ROW_COUNT: frame.height,
        "forecaster_version": FORECASTER_VERSION,
        **{k: dg.MetadataValue.json(v) if isinstance(v, dict) else v for k, v in operator.items()},
        "chosen_models": table_metadata(summary_rows(results)),
        "forecast_operator": table_metadata(operator_rows(results)),
    }
    for result in busiest_pools(results, 3):
        png = plot_forecast_png(result.history, result.forecast, title=result.pool_id)
        metadata[f"forecast_{result.pool_id}"] = dg.MetadataValue.md(png_markdown(png, result.pool_id))
    context.log.info("forecast %d pools at %s", len(results), origin)
    return dg.MaterializeResult(metadata=metadata, check_results=forecast_check_results(results))


@dg.asset(
    group_name="market", pool="warehouse", deps=[demand_forecast, FLEET_INVENTORY], kinds={"torch", "duckdb"}
)
def equilibrium_prices(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """One market tick (`market_pipeline.tick`): the Stackelberg equilibrium for the next
    interval, warm-started from the prices in force and within the promises (max step, the
    guaranteed cap, the drainable band), then the backlog shield at the capacity serving the
    interval, and each pool's capacity target. Stored in solve_reports and market_ticks."""
    config = fleet.config()
    now = tick_origin(adapter_now(fleet.get()), config.loop.tick_minutes)
    store = warehouse.get()
    serving = readers.capacity_by_pool(store)
    in_force = prices_in_force(config, store)
    inputs = build_market_problem(
        config,
        serving,
        readers.expected_demand_by_pool(store, now, FORECAST_HORIZON_MIN),
        readers.typical_demand_by_pool(store, now),
        readers.guaranteed_claim_by_pool(store, now),
        in_force,
    )
    market = config.market
    resolve_due = global_resolve_due(now, market.global_resolve_minutes, config.loop.tick_minutes)
    # the demand-response fit, its experiments, the low end of the prices each fit observed
    response, running, observed = tick_response_observed(config, store, now)
    pools = pool_tick_inputs(config, store, now, in_force, serving)
    tick = run_market_tick(
        pools,
        inputs.problem,
        Promises.from_config(config),
        solver_settings(config),
        global_resolve=resolve_due,
        switch_threshold=market.global_switch_threshold,
        response=response,
        observed=observed,
    )
    tick, experiments = run_experiments(
        config, tick, pools, inputs.problem, response, running, now, config.loop.shadow_mode, observed
    )
    record = solve_record(tick.report, now, shadow=config.loop.shadow_mode)
    solve_id = record["solve_id"][0]
    rows = tick_rows(tick, now, solve_id, config.loop.shadow_mode)
    writers.write_market_tick(store, now, record, rows, experiments)
    body = tick.report.to_dict()
    shielded = [r.pool_id for r in tick.pools if r.shielded]
    context.log.info("tick %s: solve %s, %d pools shielded", solve_id, tick.status, len(shielded))
    # only a fallback solve has a reason: no entry reading "None" on a converged one
    fallback = (
        {"fallback_reason": dg.MetadataValue.text(str(body["fallback_reason"]))}
        if body.get("fallback_reason")
        else {}
    )
    return dg.MaterializeResult(
        metadata={
            "solve_id": solve_id,
            "converged": tick.converged,
            "status": tick.status,
            "profit_per_hour": dg.MetadataValue.float(float(body["profit"] or 0.0)),
            "kkt_residual": dg.MetadataValue.float(float(body["kkt_residual"] or 0.0)),
            "iterations": int(body["iterations"]),
            "seconds": dg.MetadataValue.float(float(body["seconds"])),
            "pools_shielded": len(shielded),
            "pools_uncertified": sum(1 for r in tick.pools if not r.certified),
            "shielded_pools": dg.MetadataValue.json(shielded),
            "uncertified_pools": dg.MetadataValue.json([r.pool_id for r in tick.pools if not r.certified]),
            "global_resolve": resolve_due,
            "demand_response_fitted": len(response),
            "price_experiments": experiments.height,
            "shadow_mode": config.loop.shadow_mode,
            # per pool, the GPUs the drainable class was sold against: what the guaranteed
            # claim left (`tick.pricing.drainable_capacity`)
            "drainable_sold_against_gpus": dg.MetadataValue.json(
                {pool: round(gpus, 2) for pool, gpus in inputs.drainable_capacity_by_pool().items()}
            ),
            **fallback,
            ROW_COUNT: rows.height,
            "tick": table_metadata(
                rows.select(
                    "pool_id",
                    "list_price",
                    "solver_guaranteed",
                    "guaranteed",
                    "solver_drainable",
                    "drainable",
                    "guaranteed_reason",
                    "margin",
                    "serving_gpus",
                    "capacity_target_gpus",
                    pl.Series(
                        "valuation_factor",
                        [round(inputs.demand_scale_by_pool.get(p, 1.0), 3) for p in rows["pool_id"]],
                    ),
                )
            ),
        }
    )


@dg.asset(group_name="market", pool="warehouse", deps=[equilibrium_prices], kinds={"duckdb"})
def price_book(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Publishes the latest market tick's prices: the shielded price the guardrail certified,
    with the list price, the solver's own price and the reason beside it (before any tick, the
    list prices); in shadow mode records the prices it would publish instead."""
    config = fleet.config()
    store = warehouse.get()
    now = tick_origin(adapter_now(fleet.get()), config.loop.tick_minutes)
    published = 0
    if readers.price_book_is_empty(store):
        # Usage before the first tick is rated at the list prices.
        published += writers.append_prices(store, base_price_rows(config, BASE_PRICES_FROM))
    tick = readers.latest_tick(store, now)
    rows = published_rows(config, tick) if tick.height else None
    if rows is not None and rows.height:
        if config.loop.shadow_mode:
            writers.record_decisions(store, shadow_price_decisions(rows, now))
        else:
            published += writers.publish_prices(store, rows)
    latency = _tick_seconds(context)
    if latency is not None and tick.height:
        writers.record_tick_seconds(store, tick["tick_at"][0], latency)
    history = readers.price_history(store, now - timedelta(days=HISTORY_DAYS))
    metadata: dict[str, object] = {
        "published_rows": published,
        "shadow_mode": config.loop.shadow_mode,
        ROW_COUNT: published,
    }
    if latency is not None:
        metadata["tick_seconds"] = dg.MetadataValue.float(round(latency, 3))
    if rows is not None and rows.height:
        metadata["prices"] = table_metadata(
            rows.select(
                "pool_id",
                "resource_class",
                pl.col("price_per_gpu_hour").cast(pl.Float64),
                pl.col("list_price_per_gpu_hour").cast(pl.Float64),
                pl.col("solver_price_per_gpu_hour").cast(pl.Float64),
                "source",
                "intervention_reason",
            )
        )
    png = lines_png(history, "effective_from", "price", "resource", "Price history", "per GPU-hour")
    if png is not None:
        metadata["price_history"] = dg.MetadataValue.md(png_markdown(png, "price history"))
    return dg.MaterializeResult(metadata=metadata)


def _tick_seconds(context: dg.AssetExecutionContext) -> float | None:
    """Wall seconds from this run's start to now (the tick's prices just published)."""
    record = context.instance.get_run_record_by_id(context.run_id)
    if record is None or record.start_time is None:
        return None
    return max(0.0, datetime.now(timezone.utc).timestamp() - record.start_time)


market_assets = [demand_history, demand_forecast, equilibrium_prices, price_book]
