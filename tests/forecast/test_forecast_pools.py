"""forecast_pools: resampling to 5 minutes, gaps, output schema, errors, and the plot."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from market_pipeline.forecast.plotting import plot_forecast_png
from market_pipeline.forecast.pools import (
    FORECAST_SCHEMA,
    busiest_pools,
    demand_from_running_pending,
    forecast_pool_results,
    forecast_pools,
    regular_histories,
    summary_rows,
)
from market_pipeline.forecast.settings import ForecastInputError
from market_pipeline.lab.forecast.synthetic import job_demand, synthetic_demand_table

START = dt.datetime(2026, 2, 2)


def minute_table(pool_values: dict[str, np.ndarray]) -> pl.DataFrame:
    frames = []
    for pool_id, values in pool_values.items():
        frames.append(
            pl.DataFrame(
                {
                    "pool_id": [pool_id] * values.size,
                    "ts": [START + dt.timedelta(minutes=i) for i in range(values.size)],
                    "demand": values,
                }
            )
        )
    return pl.concat(frames)


def test_minute_samples_become_five_minute_means_up_to_a_common_origin() -> None:
    table = minute_table({"a": np.arange(20.0), "b": np.arange(10.0)})
    origin, histories = regular_histories(table)
    assert origin == START + dt.timedelta(minutes=15)
    values_a, price_a = histories["a"]
    assert values_a.tolist() == [2.0, 7.0, 12.0, 17.0]
    assert price_a is None
    values_b, _ = histories["b"]
    # Pool b stopped reporting: its missing buckets up to the origin are gaps, not dropped.
    assert values_b[:2].tolist() == [2.0, 7.0] and np.isnan(values_b[2:]).all()


def test_forecast_pools_long_format() -> None:
    table = synthetic_demand_table(3, days=2.0, seed=4)
    frame = forecast_pools(table)
    assert frame.schema == pl.Schema(FORECAST_SCHEMA)
    assert frame["pool_id"].unique().sort().to_list() == ["pool-0000", "pool-0001", "pool-0002"]
    per_pool = frame.group_by("pool_id").len()["len"].to_list()
    assert per_pool == [12 + 23] * 3
    origin = table["ts"].max()
    assert (frame["origin_ts"] == origin).all()
    assert ((frame["target_ts"] - frame["origin_ts"]).dt.total_minutes() == frame["horizon_min"]).all()
    assert (frame["q10"] <= frame["q50"]).all() and (frame["q50"] <= frame["q90"]).all()
    assert frame["model_version"].n_unique() == 1


def test_pools_with_problems_fall_back_without_stopping_the_others() -> None:
    rng = np.random.default_rng(9)
    busy = np.repeat(job_demand(rng, 600, mean_gpus=80.0), 5)  # minute samples, 5-min steps
    table = minute_table({"busy": busy, "flat": np.full(busy.size, 16.0), "new": np.array([4.0, 4.0, 5.0])})
    table = table.with_columns(
        pl.when(pl.col("pool_id") == "new")
        .then(pl.col("ts") + dt.timedelta(minutes=busy.size - 3))
        .otherwise(pl.col("ts"))
        .alias("ts")
    )
    frame = forecast_pools(table, priors={"new": 10.0})
    reasons = {
        row["pool_id"]: row["fallback_reason"]
        for row in frame.filter(pl.col("horizon_min") == 5).iter_rows(named=True)
    }
    assert reasons["busy"] is None
    assert reasons["flat"].startswith("constant history")
    assert reasons["new"].startswith("short history")


def test_price_column_reaches_the_forecaster() -> None:
    table = synthetic_demand_table(2, days=2.0, seed=5, priced_share=1.0)
    results = forecast_pool_results(table)
    assert all(result.price is not None and np.isfinite(result.price).all() for result in results)


def test_time_zone_of_the_input_is_kept() -> None:
    table = synthetic_demand_table(1, days=1.0, seed=6).with_columns(pl.col("ts").dt.replace_time_zone("UTC"))
    frame = forecast_pools(table)
    assert frame.schema["origin_ts"] == pl.Datetime("us", "UTC")


def test_bad_tables_are_rejected_with_the_column_named() -> None:
    table = synthetic_demand_table(1, days=0.5, seed=7)
    with pytest.raises(ForecastInputError, match="lacks column"):
        forecast_pools(table.drop("demand"))
    with pytest.raises(ForecastInputError, match="ts must be a datetime"):
        forecast_pools(table.with_columns(pl.col("ts").cast(pl.String)))
    with pytest.raises(ForecastInputError, match="negative"):
        forecast_pools(table.with_columns(pl.lit(-1.0).alias("demand")))
    with pytest.raises(ForecastInputError, match="no rows"):
        forecast_pools(table.clear())


def test_demand_is_running_plus_pending() -> None:
    frame = pl.DataFrame({"running_gpus": [3, 4], "pending_gpus": [1, 0]})
    assert demand_from_running_pending(frame)["demand"].to_list() == [4, 4]
    with pytest.raises(ForecastInputError, match="pending_gpus"):
        demand_from_running_pending(frame.drop("pending_gpus"))


def test_busiest_pools_plot_as_png() -> None:
    table = synthetic_demand_table(4, days=2.0, seed=8)
    results = forecast_pool_results(table)
    top = busiest_pools(results, 2)
    assert len(top) == 2
    assert top[0].forecast.q50[0] >= max(r.forecast.q50[0] for r in results) - 1e-9
    summary = summary_rows(results)
    assert [row["pool_id"] for row in summary] == [r.pool_id for r in results]
    assert all(row["model_version"] == results[0].forecast.model_version for row in summary)
    png = plot_forecast_png(top[0].history, top[0].forecast, title=top[0].pool_id)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000
