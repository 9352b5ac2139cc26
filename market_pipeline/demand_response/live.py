"""The live loop's side of the demand response: the refit's rows (`demand_response`), what
the market tick reads back (the fitted elasticities and the running experiments), and the
experiment rows it records (`price_experiments`). Nothing here decides: the fit is
`estimator`'s, the experiment prices `experiments`'."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.demand_response.estimator import ResponseFit, elasticity_at_hour
from market_pipeline.demand_response.experiments import (
    ExperimentSettings,
    ExperimentStep,
    dither_cost,
    interval_narrow,
    perturb_tick,
)
from market_pipeline.demand_response.history import fit_history, warehouse_history
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick import MarketTick, PoolTickInput, Promises
from market_pipeline.warehouse.readers import fit_at, fit_experiments_before

RUNNING, STOPPED, OFF = "running", "stopped", "off"
FIT_SCHEMA = {
    "fitted_at": pl.Datetime("us", "UTC"),
    "pool_id": pl.Utf8,
    "resource_class": pl.Utf8,
    "elasticity": pl.Float64,
    "elasticity_low": pl.Float64,
    "elasticity_high": pl.Float64,
    "elasticity_cos": pl.Float64,
    "elasticity_sin": pl.Float64,
    "lag_hours": pl.Float64,
    "price_low": pl.Float64,
    "interval_level": pl.Float64,
    "std_error": pl.Float64,
    "data_std_error": pl.Float64,
    "observations": pl.Int32,
    "method": pl.Utf8,
    "hour_bins": pl.Int32,
    "price_spread": pl.Float64,
    "r2": pl.Float64,
    "clusters": pl.Int32,
    "reason": pl.Utf8,
    "history_start": pl.Datetime("us", "UTC"),
    "history_end": pl.Datetime("us", "UTC"),
    "experiment": pl.Utf8,
    "experiment_id": pl.Utf8,
}
EXPERIMENT_SCHEMA = {
    "tick_at": pl.Datetime("us", "UTC"),
    "experiment_id": pl.Utf8,
    "pool_id": pl.Utf8,
    "resource_class": pl.Utf8,
    "sign": pl.Int32,
    "amplitude": pl.Float64,
    "base_price": pl.Float64,
    "experiment_price": pl.Float64,
    "clipped_by": pl.Utf8,
    "published": pl.Boolean,
    "estimated_cost_per_hour": pl.Float64,
}


def experiment_settings(config: MarketPipelineConfig) -> ExperimentSettings:
    dr = config.demand_response
    return ExperimentSettings(
        amplitude=dr.amplitude,
        stop_relative_width=dr.stop_relative_width,
        stop_absolute_width=dr.stop_absolute_width,
        level=dr.interval_level,
    )


def refit_rows(config: MarketPipelineConfig, store, now: datetime) -> pl.DataFrame:
    """One row per configured pool x class: the fit over the last `history_days`, the claims
    (`market.reference_elasticity`, `prior_sd`) as the prior; whether its experiment runs,
    and under which id (kept while it runs, a new one when it starts again)."""
    dr = config.demand_response
    start = now - timedelta(days=dr.history_days)
    history = warehouse_history(store, start, now)
    prior = (config.market.reference_elasticity, dr.prior_sd)
    keys = [(p.pool_id, c) for p in config.pools for c in (GUARANTEED, DRAINABLE)]
    fits = fit_history(
        history,
        priors={f"{p}/{c}": prior for p, c in keys},
        level=dr.interval_level,
        lag_hours=dr.lag_hours,
        daily_cycle=dr.daily_cycle,
        structure_alpha=dr.structure_alpha,
    )
    previous = {
        (r["pool_id"], r["resource_class"]): r
        for r in fit_experiments_before(store, now).iter_rows(named=True)
    }
    settings = experiment_settings(config)
    rows = []
    for pool_id, cls in keys:
        fit = fits.get(f"{pool_id}/{cls}") or ResponseFit(
            pool_id, cls, prior[0], None, None, 0, method="prior", reason="no sold GPU-hours in the window"
        )
        decided = interval_narrow(fit, settings, *_cost_and_ceiling(config, pool_id, cls))
        status = OFF if not dr.experiments else (STOPPED if decided else RUNNING)
        before = previous.get((pool_id, cls))
        experiment_id = None
        if status == RUNNING:
            experiment_id = (
                before["experiment_id"]
                if before and before["experiment"] == RUNNING
                else f"{pool_id}/{cls}@{now:%Y-%m-%dT%H:%MZ}"
            )
        elif before and before["experiment"] == RUNNING:
            experiment_id = before["experiment_id"]  # the row that records its stop
        rows.append(
            {
                **{k: v for k, v in fit.to_dict().items() if k in FIT_SCHEMA},
                "fitted_at": now,
                "interval_level": dr.interval_level,
                "history_start": start,
                "history_end": now,
                "experiment": status,
                "experiment_id": experiment_id,
            }
        )
    return pl.DataFrame(rows, schema=FIT_SCHEMA)


def _cost_and_ceiling(config: MarketPipelineConfig, pool_id: str, cls: str) -> tuple[float, float]:
    """A resource's unit cost and the highest price the promises allow it (the stop rule's)."""
    pool = config.pool_by_id[pool_id]
    promises = Promises.from_config(config)
    return (
        config.gpu_model_by_name[pool.gpu_model].cost_per_gpu_hour,
        promises.drainable_ceiling(pool.base_price, pool.price_max)
        if cls == DRAINABLE
        else promises.guaranteed_ceiling(pool.base_price, pool.price_max),
    )


def tick_response(
    config: MarketPipelineConfig, store, now: datetime
) -> tuple[dict[str, float], dict[str, str]]:
    """(elasticity per "<pool>/<class>" at `now`'s hour of day, on its fitted daily cycle;
    experiment id per running "<pool>/<class>") from the latest refit; empty where the demand
    response is disabled or nothing was fitted yet."""
    response, running, _ = tick_response_observed(config, store, now)
    return response, running


def tick_response_observed(
    config: MarketPipelineConfig, store, now: datetime
) -> tuple[dict[str, float], dict[str, str], dict[str, tuple[float, float]]]:
    """`tick_response`'s two, and per fit the data spoke in the low end of the prices it observed
    demand at with its elasticity at `now`'s hour (`ResponseFit.observed_at`, the bound
    `demand_response.observed_budget` names; for `run_market_tick(observed=...)`); empty where
    that is "off", and left out where the row has no `price_low` (rows fitted before it was
    recorded)."""
    if not config.demand_response.enabled:
        return {}, {}, {}
    bound = config.demand_response.observed_budget
    fits = fit_at(store, now)
    response, running, low = {}, {}, {}
    for r in fits.iter_rows(named=True):
        key = f"{r['pool_id']}/{r['resource_class']}"
        if r["elasticity"] is not None and r["method"] != "none":
            response[key] = elasticity_at_hour(
                float(r["elasticity"]),
                float(r.get("elasticity_cos") or 0.0),
                float(r.get("elasticity_sin") or 0.0),
                now.hour + now.minute / 60.0,
            )
            if bound != "off" and r.get("price_low") is not None and r["elasticity_low"] is not None:
                fit = ResponseFit(
                    r["pool_id"],
                    r["resource_class"],
                    float(r["elasticity"]),
                    float(r["elasticity_low"]),
                    r["elasticity_high"],
                    int(r["observations"] or 0),
                    method=r["method"],
                    elasticity_cos=float(r.get("elasticity_cos") or 0.0),
                    elasticity_sin=float(r.get("elasticity_sin") or 0.0),
                    price_low=float(r["price_low"]),
                )
                seen = fit.observed_at(now.hour + now.minute / 60.0, bound)
                if seen is not None:
                    low[key] = seen
        if r["experiment"] == RUNNING and config.demand_response.experiments:
            running[key] = r["experiment_id"]
    return response, running, low


def run_experiments(
    config: MarketPipelineConfig,
    tick: MarketTick,
    pools: list[PoolTickInput],
    problem,
    response: dict[str, float],
    running: dict[str, str],
    now: datetime,
    shadow: bool,
    observed: dict[str, tuple[float, float]] | None = None,
) -> tuple[MarketTick, pl.DataFrame]:
    """The tick to publish (the experiment prices, or in shadow mode the tick's own) and the
    experiment rows, each with the profit per hour the model says its dither gives up."""
    if not running:
        return tick, pl.DataFrame(schema=EXPERIMENT_SCHEMA)
    promises = Promises.from_config(config)
    settings = experiment_settings(config)
    slot = int(now.timestamp() // 60)  # one draw per tick
    moved, steps = perturb_tick(tick, pools, promises, set(running), settings, slot)
    cost = 0.0
    if problem is not None and steps:
        lists = np.array([p.list_price for p in pools for _ in (GUARANTEED, DRAINABLE)])
        cost = dither_cost(
            problem, lists, promises, response, tick.prices(), moved.prices(), observed=observed
        )
    rows = [
        _experiment_row(s, running[s.key], now, settings.amplitude, not shadow, cost / len(steps))
        for s in steps
    ]
    return (tick if shadow else moved), pl.DataFrame(rows, schema=EXPERIMENT_SCHEMA)


def _experiment_row(
    step: ExperimentStep, experiment_id: str, now: datetime, amplitude: float, published: bool, cost: float
) -> dict[str, object]:
    pool_id, cls = step.key.rsplit("/", 1)
    return {
        "tick_at": now,
        "experiment_id": experiment_id,
        "pool_id": pool_id,
        "resource_class": cls,
        "sign": step.sign,
        "amplitude": amplitude,
        "base_price": step.base_price,
        "experiment_price": step.price,
        "clipped_by": step.clipped_by,
        "published": published,
        "estimated_cost_per_hour": cost,
    }
