"""The demand-response refit: how tenants answered the loop's own prices, per pool x class.
The market tick (`equilibrium_prices`) reads the latest fit and the running experiments."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from datetime import timedelta

import dagster as dg
import polars as pl

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.demand_response.live import RUNNING, refit_rows
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.report.plots import lines_png, png_markdown
from market_pipeline.tick.state import tick_origin
from market_pipeline.warehouse import readers, writers


# Its own group: the control_loop_job (groups fleet, market, ...) does not refit every tick.
@dg.asset(
    group_name="demand_response",
    pool="warehouse",
    deps=[dg.AssetKey("price_book")],
    kinds={"duckdb", "numpy"},
)
def demand_response(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Per pool and class: the price elasticity of demand fitted on the loop's own prices (a
    fixed-effects log-log fit controlling for the hour of day and the calendar day, the claims
    as the prior) with its 80% interval, and whether its bounded price experiment still runs
    (it stops when the data's interval is narrow enough). Stored in demand_response."""
    config = fleet.config()
    now = tick_origin(adapter_now(fleet.get()), config.loop.tick_minutes)
    store = warehouse.get()
    rows = refit_rows(config, store, now)
    writers.write_demand_response(store, now, rows)
    experiments = readers.experiments_of_fit(store, now, RUNNING, config.loop.tick_minutes)
    history = readers.elasticity_history(store, now - timedelta(days=config.demand_response.history_days))
    running = rows.filter(pl.col("experiment") == RUNNING).height
    context.log.info(
        "demand response refit at %s: %d pool x class, %d experiments running", now, rows.height, running
    )
    metadata: dict[str, object] = {
        ROW_COUNT: rows.height,
        "elasticity": table_metadata(
            rows.select(
                "pool_id",
                "resource_class",
                "elasticity",
                "elasticity_low",
                "elasticity_high",
                "elasticity_cos",
                "elasticity_sin",
                "lag_hours",
                "observations",
                "method",
                "experiment",
                "reason",
            )
        ),
        "experiments_running": running,
        "experiments": table_metadata(experiments.with_columns(pl.col("since").cast(pl.Utf8))),
        "experiments_cost": dg.MetadataValue.float(float(experiments["estimated_cost"].sum() or 0.0)),
    }
    png = lines_png(history, "fitted_at", "elasticity", "resource", "Elasticity fit over time", "elasticity")
    if png is not None:
        metadata["elasticity_over_time"] = dg.MetadataValue.md(png_markdown(png, "elasticity over time"))
    return dg.MaterializeResult(metadata=metadata)


demand_response_assets = [demand_response]
