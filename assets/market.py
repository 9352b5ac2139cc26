"""The market slice of the control loop: demand history -> forecast -> equilibrium prices ->
price book. Each asset reads the warehouse, calls the domain and writes one table."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import json
from datetime import datetime, timedelta, timezone

import dagster as dg
import polars as pl

from assets.fleet import fleet_inventory
from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline import forecast as fc
from market_pipeline.demand import demand_on_grid
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.market import solve_equilibrium
from market_pipeline.market_state import (
    capacity_by_pool,
    expected_demand_by_pool,
    last_certified_prices,
    latest_solve,
    shadow_price_decisions,
    solve_record,
    tick_origin,
)
from market_pipeline.plots import lines_png, png_markdown
from market_pipeline.pricing import (
    base_price_rows,
    build_market_problem,
    last_prices_vector,
    price_book_rows,
    solver_settings,
)

HISTORY_DAYS = 3
BASE_PRICES_FROM = datetime(2024, 1, 1, tzinfo=timezone.utc)
STEP_MINUTES = 5


@dg.asset(group_name="market", pool="warehouse", deps=[fleet_inventory], kinds={"duckdb", "polars"})
def demand_history(fleet: FleetAdapterResource, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Requested GPUs (running + pending) per pool on a 5-minute grid over the last days,
    with the guaranteed price in force at each step."""
    config = fleet.config()
    end = tick_origin(adapter_now(fleet.get()), STEP_MINUTES)
    start = end - timedelta(days=HISTORY_DAYS)
    store = warehouse.get()
    usage = store.query(
        "SELECT pool_id, started_at, ended_at, gpu_fraction FROM usage_intervals "
        "WHERE ended_at > ? AND started_at < ?", [start, end])
    snapshots = store.query("SELECT ts, pool_id, pending_gpus FROM pool_demand_snapshots WHERE ts < ?", [end])
    prices = store.query(
        "SELECT effective_from, pool_id, CAST(price_per_gpu_hour AS DOUBLE) AS price FROM price_book "
        "WHERE resource_class = 'guaranteed' AND effective_from < ?", [end])
    history = demand_on_grid([p.pool_id for p in config.pools], usage, snapshots, prices, start, end,
                             STEP_MINUTES)
    store.replace_where("demand_history", "ts >= ? AND ts < ?", [start, end], history)
    latest = history.filter(pl.col("ts") == history["ts"].max())
    return dg.MaterializeResult(metadata={
        "window": dg.MetadataValue.text(f"{start.isoformat()} .. {end.isoformat()}"),
        "rows": history.height,
        "usage_intervals_read": usage.height,
        "latest_demand": dg.MetadataValue.md(latest.to_pandas().to_markdown(index=False)),
    })


@dg.asset(group_name="market", pool="warehouse", deps=[demand_history], kinds={"sklearn", "duckdb"})
def demand_forecast(context: dg.AssetExecutionContext, fleet: FleetAdapterResource,
                    warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Per pool: the chosen forecaster (never worse than persistence on validation), q10/q50/q90
    for the next hour in 5-minute steps and a coarse 24 h curve; model and version recorded."""
    store = warehouse.get()
    origin = tick_origin(adapter_now(fleet.get()), STEP_MINUTES)
    demand = store.query(
        "SELECT pool_id, ts, demand, price FROM demand_history WHERE ts < ? ORDER BY pool_id, ts", [origin])
    if demand.is_empty():
        raise dg.Failure("demand_history is empty: materialise telemetry and usage first")
    results = fc.forecast_pool_results(demand, step_minutes=STEP_MINUTES, origin_ts=origin)
    frame = fc.results_frame(results, demand.schema["ts"])
    store.replace_where("demand_forecasts", "origin_ts = ?", [origin], frame)
    summary = pl.DataFrame(fc.summary_rows(results))
    metadata: dict[str, object] = {
        "origin": dg.MetadataValue.text(origin.isoformat()),
        "pools": len(results),
        "forecaster_version": fc.FORECASTER_VERSION,
        "chosen_models": dg.MetadataValue.md(summary.to_pandas().to_markdown(index=False)),
    }
    for result in fc.busiest_pools(results, 3):
        png = fc.plot_forecast_png(result.history, result.forecast, title=result.pool_id)
        metadata[f"forecast_{result.pool_id}"] = dg.MetadataValue.md(png_markdown(png, result.pool_id))
    context.log.info("forecast %d pools at %s", len(results), origin)
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(group_name="market", pool="warehouse", deps=[demand_forecast, fleet_inventory],
          kinds={"torch", "duckdb"})
def equilibrium_prices(context: dg.AssetExecutionContext, fleet: FleetAdapterResource,
                       warehouse: WarehouseResource) -> dg.MaterializeResult:
    """The Stackelberg equilibrium for the next interval: prices per pool and class that
    maximise platform profit given every tenant's best response, warm-started from and
    bounded by a max step around the last certified prices. Stored in solve_reports."""
    config = fleet.config()
    now = tick_origin(adapter_now(fleet.get()), STEP_MINUTES)
    store = warehouse.get()
    capacity = capacity_by_pool(store)
    inputs = build_market_problem(config, capacity, expected_demand_by_pool(store, now))
    last = last_certified_prices(store)
    report = solve_equilibrium(
        inputs.problem,
        last_prices=last_prices_vector(inputs.problem, last),
        max_step=config.market.max_price_step if last else None,
        settings=solver_settings(config),
    )
    record = solve_record(report, now, shadow=config.loop.shadow_mode)
    store.append("solve_reports", record)
    body = report.to_dict()
    table = pl.DataFrame({
        "resource": list(body["prices"]),
        "price": [round(v, 4) for v in body["prices"].values()],
        "demand_gpus": [round(v, 3) if v is not None else None for v in body["demand"].values()],
        "capacity_gpus": [float(inputs.problem.resources.capacity[i]) for i in range(len(body["prices"]))],
        "demand_scale": [round(inputs.demand_scale_by_pool[inputs.pool_of_resource[name]], 3)
                         for name in body["prices"]],
    })
    context.log.info("solve %s: %s, profit %.2f", record["solve_id"][0], body.get("status"), body["profit"] or 0)
    return dg.MaterializeResult(metadata={
        "solve_id": record["solve_id"][0],
        "converged": report.converged,
        "status": str(body.get("status")),
        "profit_per_hour": dg.MetadataValue.float(float(body["profit"] or 0.0)),
        "kkt_residual": dg.MetadataValue.float(float(body["kkt_residual"] or 0.0)),
        "iterations": int(body["iterations"]),
        "seconds": dg.MetadataValue.float(float(body["seconds"])),
        "fallback_reason": dg.MetadataValue.text(str(body.get("fallback_reason"))),
        "shadow_mode": config.loop.shadow_mode,
        "prices": dg.MetadataValue.md(table.to_pandas().to_markdown(index=False)),
    })


@dg.asset(group_name="market", pool="warehouse", deps=[equilibrium_prices], kinds={"duckdb"})
def price_book(fleet: FleetAdapterResource, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Publishes the latest solve's prices (or, before any solve, the configured base prices)
    effective from the tick; in shadow mode records the prices it would publish instead."""
    config = fleet.config()
    store = warehouse.get()
    solve = latest_solve(store)
    now = tick_origin(adapter_now(fleet.get()), STEP_MINUTES)
    published = 0
    if store.query("SELECT count(*) AS n FROM price_book")["n"][0] == 0:
        # Usage before the first solve is rated at the configured base prices.
        published += store.append("price_book", base_price_rows(config, BASE_PRICES_FROM))
    rows = None
    if solve is not None:
        prices = json.loads(solve["report"])["prices"]
        rows = price_book_rows(config, prices, solve["solved_at"], solve["solve_id"],
                               source="solver" if solve["converged"] else "fallback")
        if config.loop.shadow_mode:
            store.upsert("decisions", shadow_price_decisions(rows, now))
        else:
            published += store.replace_where("price_book", "effective_from = ?",
                                             [rows["effective_from"][0]], rows)
    history = store.query(
        "SELECT effective_from, pool_id || '/' || resource_class AS resource, "
        "CAST(price_per_gpu_hour AS DOUBLE) AS price FROM price_book "
        "WHERE effective_from >= ? ORDER BY effective_from", [now - timedelta(days=HISTORY_DAYS)])
    metadata: dict[str, object] = {
        "published_rows": published,
        "shadow_mode": config.loop.shadow_mode,
    }
    if rows is not None:
        metadata["prices"] = dg.MetadataValue.md(rows.to_pandas().to_markdown(index=False))
    png = lines_png(history, "effective_from", "price", "resource", "Price history", "per GPU-hour")
    if png is not None:
        metadata["price_history"] = dg.MetadataValue.md(png_markdown(png, "price history"))
    return dg.MaterializeResult(metadata=metadata)


market_assets = [demand_history, demand_forecast, equilibrium_prices, price_book]
