"""Forecasts for every pool of a long demand table (the `demand_forecast` asset's domain call)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from market_pipeline.forecast.pool import PoolForecast, fit_and_forecast
from market_pipeline.forecast.settings import DEFAULT_SETTINGS, ForecastInputError, ForecastSettings
from market_pipeline.forecast.survival import DemandContext

REQUIRED_COLUMNS = ("pool_id", "ts", "demand")

FORECAST_SCHEMA: dict[str, pl.DataType] = {
    "pool_id": pl.String(),
    "origin_ts": pl.Datetime("us"),
    "target_ts": pl.Datetime("us"),
    "horizon_min": pl.Int32(),
    "q10": pl.Float64(),
    "q50": pl.Float64(),
    "q90": pl.Float64(),
    "model": pl.String(),
    "model_version": pl.String(),
    "validation_mae": pl.Float64(),
    "fallback_reason": pl.String(),
}


@dataclass(frozen=True)
class PoolResult:
    """One pool's regular history (NaN = missing step) and its forecast from `origin_ts`."""

    pool_id: str
    origin_ts: dt.datetime
    history: np.ndarray
    price: np.ndarray | None
    forecast: PoolForecast


def demand_from_running_pending(frame: pl.DataFrame) -> pl.DataFrame:
    """Requested GPUs = running + pending, for tables that carry the two counts."""
    missing = [c for c in ("running_gpus", "pending_gpus") if c not in frame.columns]
    if missing:
        raise ForecastInputError(f"demand table lacks column(s) {', '.join(missing)}")
    return frame.with_columns((pl.col("running_gpus") + pl.col("pending_gpus")).alias("demand"))


def regular_histories(
    demand: pl.DataFrame,
    *,
    step_minutes: int = 5,
    origin_ts: dt.datetime | None = None,
    max_points: int | None = None,
) -> tuple[dt.datetime, dict[str, tuple]]:
    """Per pool: (demand, price | None) on a `step_minutes` grid ending at the common origin.

    Samples are averaged per bucket (ts floored to the step); missing buckets are NaN so the
    forecaster sees, and reports, gaps and staleness. The origin defaults to the newest bucket.
    """
    _check_columns(demand)
    has_price = "price" in demand.columns
    step = f"{step_minutes}m"
    aggregations = [pl.col("demand").cast(pl.Float64).mean().alias("demand")]
    if has_price:
        aggregations.append(pl.col("price").cast(pl.Float64).mean().alias("price"))
    buckets = (
        demand.with_columns(pl.col("ts").dt.truncate(step).alias("bucket"), pl.col("pool_id").cast(pl.String))
        .group_by("pool_id", "bucket")
        .agg(aggregations)
    )
    if buckets.is_empty():
        raise ForecastInputError("demand table has no rows")
    newest = buckets["bucket"].max()
    origin = newest if origin_ts is None else _floor(origin_ts, step_minutes)
    buckets = buckets.filter(pl.col("bucket") <= origin)
    offsets = (origin - pl.col("bucket")).dt.total_minutes() // step_minutes
    buckets = buckets.with_columns(offsets.cast(pl.Int64).alias("steps_back"))
    if max_points is not None:
        buckets = buckets.filter(pl.col("steps_back") < max_points)
    histories: dict[str, tuple] = {}
    for (pool_id,), part in buckets.partition_by("pool_id", as_dict=True).items():
        length = int(part["steps_back"].max()) + 1
        index = length - 1 - part["steps_back"].to_numpy()
        values = np.full(length, np.nan)
        values[index] = part["demand"].to_numpy()
        price = None
        if has_price:
            price = np.full(length, np.nan)
            price[index] = part["price"].fill_null(np.nan).to_numpy()
        histories[str(pool_id)] = (values, price)
    return origin, histories


def forecast_pool_results(
    demand: pl.DataFrame,
    *,
    step_minutes: int = 5,
    horizon_steps: int = 12,
    origin_ts: dt.datetime | None = None,
    priors: Mapping[str, float] | None = None,
    settings: ForecastSettings | None = None,
    contexts: Mapping[str, DemandContext] | None = None,
) -> list[PoolResult]:
    """Fit and forecast every pool; results keep the history for plots and metadata.

    `contexts` (optional, per pool) feed the survival + arrival candidate with task ages,
    lifetimes and the arrival rate (see survival.DemandContext)."""
    settings = settings or DEFAULT_SETTINGS
    origin, histories = regular_histories(
        demand, step_minutes=step_minutes, origin_ts=origin_ts, max_points=settings.max_history_points
    )
    priors, contexts = priors or {}, contexts or {}
    results = []
    for pool_id in sorted(histories):
        values, price = histories[pool_id]
        forecast = fit_and_forecast(
            values,
            step_minutes=step_minutes,
            horizon_steps=horizon_steps,
            price=price,
            prior=priors.get(pool_id),
            settings=settings,
            context=contexts.get(pool_id),
        )
        results.append(PoolResult(pool_id, origin, values, price, forecast))
    return results


def results_frame(results: list[PoolResult], ts_dtype: pl.DataType | None = None) -> pl.DataFrame:
    """Storage rows of all results; `ts_dtype` keeps the input's time unit and zone."""
    schema = dict(FORECAST_SCHEMA)
    if ts_dtype is not None:
        schema["origin_ts"] = schema["target_ts"] = ts_dtype
    rows = [row for result in results for row in result.forecast.to_rows(result.pool_id, result.origin_ts)]
    return pl.DataFrame(rows, schema=schema, orient="row")


def forecast_pools(
    demand: pl.DataFrame,
    *,
    step_minutes: int = 5,
    horizon_steps: int = 12,
    origin_ts: dt.datetime | None = None,
    priors: Mapping[str, float] | None = None,
    settings: ForecastSettings | None = None,
) -> pl.DataFrame:
    """Long-format forecasts for every pool in `demand` (columns pool_id, ts, demand[, price]).

    Output columns: pool_id, origin_ts, target_ts, horizon_min, q10, q50, q90, model,
    model_version, validation_mae, fallback_reason; `step_minutes` steps to the horizon, then
    hourly points to 24 h; time stamps keep the dtype (unit, zone) of `ts`.
    """
    results = forecast_pool_results(
        demand,
        step_minutes=step_minutes,
        horizon_steps=horizon_steps,
        origin_ts=origin_ts,
        priors=priors,
        settings=settings,
    )
    return results_frame(results, demand.schema["ts"])


def summary_rows(results: list[PoolResult]) -> list[dict[str, object]]:
    """Per pool: chosen models, validation errors and fallback reasons (operator metadata)."""
    return [
        {
            "pool_id": result.pool_id,
            "model": result.forecast.model,
            "chosen_by": result.forecast.chosen_by,
            "validation_mae": result.forecast.validation_mae,
            "persistence_validation_mae": result.forecast.persistence_validation_mae,
            "coarse_model": result.forecast.coarse_model,
            "q50_next": float(result.forecast.q50[0]),
            "q90_horizon": float(result.forecast.q90[-1]),
            "history_points": result.forecast.history_points,
            "online_steps": result.forecast.online_steps,
            "model_version": result.forecast.model_version,
            "fallback_reason": result.forecast.fallback_reason,
        }
        for result in results
    ]


def busiest_pools(results: list[PoolResult], count: int) -> list[PoolResult]:
    """Pools with the highest median forecast one step ahead (for plots)."""
    return sorted(results, key=lambda result: -float(result.forecast.q50[0]))[:count]


def _check_columns(demand: pl.DataFrame) -> None:
    missing = [column for column in REQUIRED_COLUMNS if column not in demand.columns]
    if missing:
        raise ForecastInputError(
            f"demand table lacks column(s) {', '.join(missing)}; has {', '.join(demand.columns)}"
        )
    if not isinstance(demand.schema["ts"], pl.Datetime):
        raise ForecastInputError(f"demand column ts must be a datetime, got {demand.schema['ts']}")
    if not demand.schema["demand"].is_numeric():
        raise ForecastInputError(f"demand column demand must be numeric, got {demand.schema['demand']}")
    negative = demand.filter(pl.col("demand") < 0)
    if negative.height:
        first = negative.row(0, named=True)
        raise ForecastInputError(
            f"demand column demand has {negative.height} negative value(s), e.g. pool "
            f"{first['pool_id']} at {first['ts']}: {first['demand']}"
        )
    if demand["pool_id"].null_count():
        raise ForecastInputError("demand column pool_id has null values")


def _floor(moment: dt.datetime, step_minutes: int) -> dt.datetime:
    minute = moment.minute - moment.minute % step_minutes
    return moment.replace(minute=minute, second=0, microsecond=0)
