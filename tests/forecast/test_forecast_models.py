"""Candidate forecasters, features and conformal pieces, on small hand-made series."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.forecast.candidates import build_candidates
from market_pipeline.forecast.conformal import calibrate, conformal_quantiles
from market_pipeline.forecast.features import Series, feature_matrix, seasonal_offsets
from market_pipeline.forecast.models import (
    ExpSmoothing,
    Persistence,
    RidgeOnChanges,
    SeasonalNaive,
)
from market_pipeline.forecast.settings import (
    DEFAULT_SETTINGS,
    ForecastInputError,
    ForecastSettings,
    ForecastSettingsError,
)

PERIOD = 24


def test_persistence_repeats_the_origin_value() -> None:
    series = Series(np.arange(10.0), PERIOD)
    forecast = Persistence().predict(series, np.array([3, 7]), np.array([1, 2, 5]))
    assert forecast.tolist() == [[3.0] * 3, [7.0] * 3]


def test_seasonal_naive_reads_one_period_before_the_target() -> None:
    values = np.arange(100.0)
    forecast = SeasonalNaive(PERIOD).predict(Series(values, PERIOD), np.array([30]), np.array([1, 12, 24]))
    assert forecast.tolist() == [[30 + 1 - 24, 30 + 12 - 24, 30 + 24 - 24]]


def test_exp_smoothing_prefers_a_high_alpha_on_a_random_walk() -> None:
    rng = np.random.default_rng(1)
    walk = 50 + np.cumsum(rng.normal(0, 1, 600))
    model = ExpSmoothing()
    series = Series(walk, PERIOD)
    assert model.fit(series, np.arange(12, 580), np.arange(1, 13))
    assert model.alpha >= 0.7
    # The smoothed level lies between the origin value and older values, never beyond.
    level = model.predict(series, np.array([599]), np.array([1]))[0, 0]
    assert walk[550:].min() <= level <= walk[550:].max()


def test_features_never_read_past_the_origin() -> None:
    rng = np.random.default_rng(2)
    values = rng.poisson(40, 400).astype(float)
    price = rng.uniform(1, 3, 400)
    origins = np.arange(PERIOD, 300)
    offsets = seasonal_offsets(np.arange(1, 13), PERIOD)
    before = feature_matrix(Series(values, PERIOD, price), origins, seasonal_offsets=offsets, with_price=True)
    changed_values, changed_price = values.copy(), price.copy()
    changed_values[300:] += 1000.0  # the future changes ...
    changed_price[300:] *= 5.0
    after = feature_matrix(
        Series(changed_values, PERIOD, changed_price), origins, seasonal_offsets=offsets, with_price=True
    )
    np.testing.assert_array_equal(before, after)  # ... features up to origin 299 do not


def test_feature_origins_before_the_lookback_are_rejected() -> None:
    series = Series(np.ones(100), PERIOD)
    with pytest.raises(ValueError, match="lookback"):
        feature_matrix(series, np.array([3]), seasonal_offsets=(0, 6), with_price=False)


def test_ridge_learns_a_deterministic_trend_that_persistence_misses() -> None:
    values = 10.0 + 0.5 * np.arange(600)
    series = Series(values, PERIOD)
    model = RidgeOnChanges(DEFAULT_SETTINGS, len(series), PERIOD, with_price=False)
    horizons = np.arange(1, 7)
    assert model.fit(series, np.arange(model.min_origin(), 500), horizons)
    forecast = model.predict(series, np.array([550]), horizons)[0]
    np.testing.assert_allclose(forecast, values[551:557], atol=0.5)


def test_ridge_declines_to_fit_on_too_few_rows() -> None:
    series = Series(np.arange(200.0), PERIOD)
    model = RidgeOnChanges(DEFAULT_SETTINGS, len(series), PERIOD, with_price=False)
    assert not model.fit(series, np.arange(60, 80), np.arange(1, 4))


def test_candidates_start_with_persistence_and_respect_settings() -> None:
    series = Series(np.arange(100.0), PERIOD)
    names = [c.name for c in build_candidates(ForecastSettings(learned_models=()), series)]
    assert names == ["persistence", "seasonal_naive", "exp_smoothing"]
    short = Series(np.arange(10.0), PERIOD)  # too short for seasonal naive
    names = [c.name for c in build_candidates(DEFAULT_SETTINGS, short)]
    assert names == ["persistence", "exp_smoothing", "survival"]  # no price: no lag models
    priced = Series(np.arange(10.0), PERIOD, np.linspace(1.0, 2.0, 10))
    names = [c.name for c in build_candidates(DEFAULT_SETTINGS, priced)]
    assert names == ["persistence", "exp_smoothing", "ridge", "survival"]
    anyway = ForecastSettings(learned_need_price=False)
    assert "ridge" in [c.name for c in build_candidates(anyway, short)]


def test_conformal_ranks_follow_the_finite_sample_rule() -> None:
    residuals = np.arange(1.0, 20.0)[:, None]  # n = 19, so (n + 1) * 0.1 = 2, * 0.9 = 18
    low, high = conformal_quantiles(residuals, 0.1, 0.9)
    assert (low[0], high[0]) == (2.0, 18.0)


def test_calibration_scales_with_recent_volatility() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(100, 0.5, 300), rng.normal(100, 5.0, 300)])
    series = Series(values, PERIOD)
    origins = np.arange(1, 590)
    residuals = (values[origins + 1] - values[origins])[:, None]
    calibration = calibrate(
        residuals, series, origins, np.array([1]), window=12, floor=0.1, lower_level=0.1, upper_level=0.9
    )
    point = np.array([[100.0], [100.0]])
    low, high = calibration.bounds(point, series, np.array([200, 500]))
    quiet, busy = high[0, 0] - low[0, 0], high[1, 0] - low[1, 0]
    assert busy > 4 * quiet


def test_extrapolated_calibration_grows_like_sqrt_of_horizon() -> None:
    rng = np.random.default_rng(4)
    values = 50 + np.cumsum(rng.normal(0, 1, 400))
    series = Series(values, PERIOD)
    origins = np.arange(0, 399)
    residuals = (values[origins + 1] - values[origins])[:, None]
    base = calibrate(
        residuals, series, origins, np.array([1]), window=12, floor=0.5, lower_level=0.1, upper_level=0.9
    )
    grown = base.extrapolated(np.array([4, 16]))
    np.testing.assert_allclose(grown.upper, base.upper[0] * np.array([2.0, 4.0]))


def test_settings_validate_and_fingerprint() -> None:
    with pytest.raises(ForecastSettingsError, match="learned_models"):
        ForecastSettings(learned_models=("prophet",))
    with pytest.raises(ForecastSettingsError, match="choice_margin"):
        ForecastSettings(choice_margin=1.5)
    with pytest.raises(ForecastSettingsError, match="unknown forecast setting"):
        ForecastSettings.from_mapping({"ridge_alpha": 0.1, "colour": "red"})
    tuned = ForecastSettings.from_mapping({"learned_models": ["ridge", "gbm"]})
    assert tuned.learned_models == ("ridge", "gbm")
    assert tuned.model_version() != DEFAULT_SETTINGS.model_version()
    assert DEFAULT_SETTINGS.model_version() == ForecastSettings().model_version()
    with pytest.raises(ForecastInputError, match="step_minutes=7"):
        DEFAULT_SETTINGS.steps(7)
    assert DEFAULT_SETTINGS.steps(5) == (288, 12)
