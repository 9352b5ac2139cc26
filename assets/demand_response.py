"""The demand-response refit: how tenants answered the loop's own prices, per pool x class.
The market tick (`equilibrium_prices`) reads the latest fit and the running experiments."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from datetime import timedelta

import dagster as dg
import polars as pl

from assets.market import price_book, table_metadata
from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.config import DemandResponseConfig, load_config
from market_pipeline.demand_response.live import RUNNING, refit_rows
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.market_state import tick_origin
from market_pipeline.report.plots import lines_png, png_markdown
from sensors.schedules import tick_schedule

STEP_MINUTES = 5


# Its own group: the control_loop_job (groups fleet, market, ...) does not refit every tick.
@dg.asset(group_name="demand_response", pool="warehouse", deps=[price_book], kinds={"duckdb", "numpy"})
def demand_response(context: dg.AssetExecutionContext, fleet: FleetAdapterResource,
                    warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Per pool and class: the price elasticity of demand fitted on the loop's own prices (a
    fixed-effects log-log fit controlling for the hour of day and the calendar day, the claims
    as the prior) with its 80% interval, and whether its bounded price experiment still runs
    (it stops when the data's interval is narrow enough). Stored in demand_response."""
    config = fleet.config()
    now = tick_origin(adapter_now(fleet.get()), STEP_MINUTES)
    store = warehouse.get()
    rows = refit_rows(config, store, now)
    store.replace_where("demand_response", "fitted_at = ?", [now], rows)
    experiments = store.query(
        "SELECT experiment_id, pool_id, resource_class, count(*) AS ticks, min(tick_at) AS since, "
        "sum(estimated_cost_per_hour) * ? / 60.0 AS estimated_cost, bool_and(published) AS published "
        "FROM price_experiments WHERE experiment_id IN (SELECT experiment_id FROM demand_response "
        "WHERE fitted_at = ? AND experiment = ?) GROUP BY ALL ORDER BY experiment_id",
        [config.loop.tick_minutes, now, RUNNING])
    history = store.query(
        "SELECT fitted_at, pool_id || '/' || resource_class AS resource, elasticity FROM demand_response "
        "WHERE fitted_at >= ? AND elasticity IS NOT NULL ORDER BY fitted_at",
        [now - timedelta(days=config.demand_response.history_days)])
    running = rows.filter(pl.col("experiment") == RUNNING).height
    context.log.info("demand response refit at %s: %d pool x class, %d experiments running", now, rows.height, running)
    metadata: dict[str, object] = {
        "dagster/row_count": rows.height,
        "elasticity": table_metadata(rows.select(
            "pool_id", "resource_class", "elasticity", "elasticity_low", "elasticity_high", "observations",
            "method", "experiment", "reason")),
        "experiments_running": running,
        "experiments": table_metadata(experiments.with_columns(pl.col("since").cast(pl.Utf8))),
        "experiments_cost": dg.MetadataValue.float(float(experiments["estimated_cost"].sum() or 0.0)),
    }
    png = lines_png(history, "fitted_at", "elasticity", "resource", "Elasticity fit over time", "elasticity")
    if png is not None:
        metadata["elasticity_over_time"] = dg.MetadataValue.md(png_markdown(png, "elasticity over time"))
    return dg.MaterializeResult(metadata=metadata)


demand_response_job = dg.define_asset_job("demand_response_job", selection=[demand_response])


def demand_response_schedule_for(settings: DemandResponseConfig) -> dg.ScheduleDefinition:
    return tick_schedule("demand_response_refit", demand_response_job, f"0 */{settings.refit_hours} * * *",
                         f"Refit the demand response every {settings.refit_hours} h (demand_response.refit_hours).")


demand_response_schedule = demand_response_schedule_for(load_config(resolve_fleet=False).demand_response)
demand_response_assets = [demand_response]
