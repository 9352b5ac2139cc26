"""The live tick reads the forecast's upper quantile at the horizon the scaling policy needs."""

from __future__ import annotations

import datetime as dt

import polars as pl

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config
from market_pipeline.tick.live import pool_tick_inputs
from market_pipeline.tick.state import capacity_horizon_minutes
from market_pipeline.warehouse import open_warehouse

ORIGIN = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.timezone.utc)


def _config(**scaling: float):
    config = load_config(DEFAULT_CONFIG_PATH, environ={})
    return config.model_copy(update={"scaling": config.scaling.model_copy(update=scaling)})


def test_capacity_horizon_follows_the_policys_own_timings() -> None:
    assert capacity_horizon_minutes(_config()) == 60  # the defaults: an hour, as before
    assert capacity_horizon_minutes(_config(scale_up_persistence_minutes=240.0)) == 240
    assert capacity_horizon_minutes(_config(hysteresis_minutes=100.0)) == 105  # + 5 cooldown
    assert capacity_horizon_minutes(_config(scale_up_persistence_minutes=92.0)) == 95  # step
    assert capacity_horizon_minutes(_config(scale_up_persistence_minutes=5000.0)) == 1440


def _forecasts(pool_ids: list[str]) -> pl.DataFrame:
    """q90 rises with the horizon: 100 + the horizon in minutes (fine to 1 h, hourly to 6 h)."""
    horizons = list(range(5, 65, 5)) + list(range(120, 420, 60))
    rows = [
        {
            "pool_id": pool,
            "origin_ts": ORIGIN,
            "target_ts": ORIGIN + dt.timedelta(minutes=h),
            "horizon_min": h,
            "q10": 90.0,
            "q50": 100.0,
            "q90": 100.0 + h,
            "model": "persistence",
            "model_version": "t",
            "validation_mae": None,
            "fallback_reason": None,
        }
        for pool in pool_ids
        for h in horizons
    ]
    return pl.DataFrame(
        rows, schema_overrides={"origin_ts": pl.Datetime("us", "UTC"), "target_ts": pl.Datetime("us", "UTC")}
    )


def test_tick_reads_the_upper_quantile_at_the_capacity_horizon(tmp_path) -> None:
    store = open_warehouse(tmp_path / "w.duckdb")
    short, long = _config(), _config(scale_up_persistence_minutes=240.0)
    pools = [pool.pool_id for pool in short.pools]
    store.append("demand_forecasts", _forecasts(pools))
    in_force = {f"{p}/{c}": 1.0 for p in pools for c in ("guaranteed", "drainable")}
    now = ORIGIN + dt.timedelta(minutes=1)
    hour = pool_tick_inputs(short, store, now, in_force, {})
    four_hours = pool_tick_inputs(long, store, now, in_force, {})
    assert [p.forecast_upper_gpus for p in hour] == [160.0] * len(pools)
    assert [p.forecast_upper_gpus for p in four_hours] == [340.0] * len(pools)
