"""fit_and_forecast: shapes, ordering, storage rows, and every fallback path."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from market_pipeline.forecast.history import prepare_history
from market_pipeline.forecast.pool import fit_and_forecast
from market_pipeline.forecast.settings import (
    DEFAULT_SETTINGS,
    FORECASTER_VERSION,
    ForecastInputError,
    ForecastSettings,
)
from market_pipeline.lab.forecast.synthetic import job_demand

ORIGIN = dt.datetime(2026, 3, 1, 12, 0)


@pytest.fixture(scope="module")
def busy_history() -> np.ndarray:
    return job_demand(np.random.default_rng(11), 3 * 288, mean_gpus=150.0)


def assert_ordered_band(low: np.ndarray, mid: np.ndarray, high: np.ndarray) -> None:
    assert np.all(low <= mid) and np.all(mid <= high)
    assert np.all(low >= 0) and np.all(np.isfinite(high))


def test_forecast_has_fine_path_and_hourly_day_curve(busy_history: np.ndarray) -> None:
    forecast = fit_and_forecast(busy_history)
    assert forecast.q50.shape == forecast.q10.shape == forecast.q90.shape == (12,)
    assert forecast.coarse_q50.shape == (24,)
    assert forecast.horizon_minutes.tolist() == list(range(5, 65, 5))
    assert forecast.coarse_horizon_minutes[-1] == 1440
    assert_ordered_band(forecast.q10, forecast.q50, forecast.q90)
    assert_ordered_band(forecast.coarse_q10, forecast.coarse_q50, forecast.coarse_q90)
    assert forecast.fallback_reason is None
    assert forecast.validation_mae is not None and forecast.persistence_validation_mae is not None
    assert forecast.validation_mae <= forecast.persistence_validation_mae
    assert forecast.model_version.startswith(FORECASTER_VERSION + "+")
    # The band widens with the horizon: uncertainty grows, it does not shrink.
    assert forecast.q90[-1] - forecast.q10[-1] >= forecast.q90[0] - forecast.q10[0]


def test_rows_cover_fine_then_coarse_horizons_once(busy_history: np.ndarray) -> None:
    forecast = fit_and_forecast(busy_history)
    rows = forecast.to_rows("a100/zone-a", ORIGIN)
    minutes = [row["horizon_min"] for row in rows]
    assert minutes == list(range(5, 65, 5)) + list(range(120, 1441, 60))
    assert len(set(minutes)) == len(minutes)
    first = rows[0]
    assert first["target_ts"] == ORIGIN + dt.timedelta(minutes=5)
    assert first["model"] == forecast.model and first["model_version"] == forecast.model_version
    assert first["q50"] == pytest.approx(float(forecast.q50[0]))
    assert rows[-1]["model"] == forecast.coarse_model
    assert all(row["pool_id"] == "a100/zone-a" for row in rows)


def test_horizon_and_step_are_honoured(busy_history: np.ndarray) -> None:
    forecast = fit_and_forecast(busy_history, horizon_steps=6)
    assert forecast.q50.shape == (6,)
    hourly = fit_and_forecast(busy_history[::3], step_minutes=15, horizon_steps=4)
    assert hourly.horizon_minutes.tolist() == [15, 30, 45, 60]
    with pytest.raises(ForecastInputError, match="horizon_steps"):
        fit_and_forecast(busy_history, horizon_steps=0)


def test_constant_history_falls_back_to_persistence_with_a_band() -> None:
    forecast = fit_and_forecast(np.full(500, 64.0))
    assert forecast.model == "persistence"
    assert "constant history" in forecast.fallback_reason
    assert np.all(forecast.q50 == 64.0)
    assert forecast.q10[-1] < 64.0 < forecast.q90[-1]
    assert forecast.validation_mae is None


def test_short_history_uses_the_last_value() -> None:
    forecast = fit_and_forecast(np.array([3.0, 5.0, 8.0]))
    assert forecast.model == "persistence"
    assert forecast.fallback_reason.startswith("short history: 3 usable points")
    assert np.all(forecast.q50 == 8.0)


def test_empty_or_unobserved_history_uses_the_prior() -> None:
    assert fit_and_forecast(np.array([]), prior=12.0).q50[0] == 12.0
    forecast = fit_and_forecast(np.full(40, np.nan))
    assert forecast.model == "prior"
    assert forecast.fallback_reason == "no observed demand in history"
    assert forecast.q50[0] == DEFAULT_SETTINGS.default_prior


def test_stale_history_prefers_the_prior_when_given(busy_history: np.ndarray) -> None:
    stale = np.concatenate([busy_history, np.full(30, np.nan)])
    with_prior = fit_and_forecast(stale, prior=7.0)
    assert with_prior.model == "prior" and with_prior.q50[0] == 7.0
    assert "stale history: newest observation is 30 steps old" in with_prior.fallback_reason
    without_prior = fit_and_forecast(stale)
    assert without_prior.model == "persistence"
    assert without_prior.q50[0] == busy_history[-1]


def test_short_gaps_are_carried_and_long_gaps_cut_history(busy_history: np.ndarray) -> None:
    gappy = busy_history.copy()
    gappy[100:104] = np.nan  # short: carried forward
    gappy[-3:] = np.nan  # slightly stale: carried forward to the origin
    prepared = prepare_history(gappy, None, DEFAULT_SETTINGS)
    assert prepared.reason is None and prepared.values.size == busy_history.size
    assert np.all(prepared.values[100:104] == busy_history[99])
    assert np.all(prepared.values[-3:] == busy_history[-4])
    assert fit_and_forecast(gappy).fallback_reason is None
    cut = busy_history.copy()
    cut[-40:-20] = np.nan  # long gap: only the 20 points after it are usable
    forecast = fit_and_forecast(cut)
    assert "since a 20-step gap" in forecast.fallback_reason
    assert forecast.history_points == 20
    assert forecast.q50[0] == busy_history[-1]


def test_history_after_a_long_gap_is_fitted_when_long_enough(busy_history: np.ndarray) -> None:
    cut = busy_history.copy()
    cut[100:200] = np.nan
    forecast = fit_and_forecast(cut)
    assert forecast.fallback_reason is None
    assert forecast.history_points == busy_history.size - 200


def test_malformed_input_is_rejected_with_the_field_named() -> None:
    with pytest.raises(ForecastInputError, match="negative"):
        fit_and_forecast(np.array([1.0, -2.0, 3.0]))
    with pytest.raises(ForecastInputError, match="one-dimensional"):
        fit_and_forecast(np.ones((3, 3)))
    with pytest.raises(ForecastInputError, match="infinite"):
        fit_and_forecast(np.array([1.0, np.inf]))
    with pytest.raises(ForecastInputError, match="price has 2 points"):
        fit_and_forecast(np.ones(5), price=np.ones(2))
    with pytest.raises(ForecastInputError, match="prior"):
        fit_and_forecast(np.ones(5), prior=-1.0)


def test_price_with_gaps_is_accepted(busy_history: np.ndarray) -> None:
    price = np.where(np.arange(busy_history.size) < 50, np.nan, 2.0)
    price[400:] = 2.5
    forecast = fit_and_forecast(busy_history, price=price)
    assert forecast.fallback_reason is None


def test_extreme_but_valid_inputs_never_crash() -> None:
    spikes = np.zeros(600)
    spikes[::97] = 1e6
    for history in (spikes, np.r_[np.zeros(300), np.full(300, 5.0)], np.arange(36.0)):
        forecast = fit_and_forecast(history)
        assert_ordered_band(forecast.q10, forecast.q50, forecast.q90)
    with_gbm = fit_and_forecast(
        spikes[:300], settings=ForecastSettings(learned_models=("gbm",), learned_need_price=False)
    )
    assert "gbm" in with_gbm.validation_mae_by_model
    assert_ordered_band(with_gbm.q10, with_gbm.q50, with_gbm.q90)
