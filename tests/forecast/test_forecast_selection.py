"""Rolling-origin model choice (persistence guard), calibration and price as a feature."""

from __future__ import annotations

import numpy as np

from market_pipeline.forecast.features import Series
from market_pipeline.forecast.selection import fit_group, gain_t_statistic, validation_folds
from market_pipeline.forecast.settings import DEFAULT_SETTINGS, ForecastSettings
from market_pipeline.lab.forecast.synthetic import job_demand, stepped_price

PERIOD = 288
FINE = np.arange(1, 13)


def price_driven_demand(seed: int, steps: int = 4 * PERIOD) -> tuple[np.ndarray, np.ndarray]:
    """Demand that moves towards a price-dependent level after every price change."""
    rng = np.random.default_rng(seed)
    price = stepped_price(rng, steps, change_every=36)
    phase = 2 * np.pi * np.arange(steps) / PERIOD
    target = 100 + 20 * np.sin(phase) - 60 * (price / price.mean() - 1)
    demand = np.empty(steps)
    demand[0] = target[0]
    for i in range(1, steps):
        demand[i] = demand[i - 1] + 0.1 * (target[i] - demand[i - 1]) + rng.normal(0, 1.0)
    return np.maximum(demand, 0.0), price


def holdout_mae(values: np.ndarray, price: np.ndarray | None, fit_points: int) -> tuple:
    group = fit_group(
        Series(values[:fit_points], PERIOD, None if price is None else price[:fit_points]),
        FINE,
        DEFAULT_SETTINGS,
    )
    origins = np.arange(fit_points, values.size - 12)
    _, median, _ = group.predict(Series(values, PERIOD, price), origins)
    target = values[origins + 12]
    return group, np.mean(np.abs(target - median[:, -1])), np.mean(np.abs(target - values[origins]))


def test_gain_statistic_accounts_for_autocorrelation() -> None:
    rng = np.random.default_rng(10)
    reference = rng.exponential(5.0, 2000)
    assert gain_t_statistic(reference, reference * 0.8, lag=12) > 5.0
    assert gain_t_statistic(reference, reference * 1.2, lag=12) < -5.0
    # A persistent (autocorrelated) noise gain looks significant only if the lags are ignored.
    drift = np.repeat(rng.normal(0.0, 1.0, 40), 50)
    candidate = reference - 0.3 - drift
    naive, robust = (gain_t_statistic(reference, candidate, lag) for lag in (0, 200))
    assert naive > 2 * robust


def test_folds_are_contiguous_tail_blocks() -> None:
    folds = validation_folds(last_origin=999, first_origin=0, settings=DEFAULT_SETTINGS, max_horizon=12)
    assert len(folds) == 3
    joined = np.concatenate(folds)
    assert joined[-1] == 999 and np.all(np.diff(joined) == 1)
    assert joined.size == 300
    assert validation_folds(20, 0, DEFAULT_SETTINGS, 12) == []


def test_persistence_is_kept_on_a_random_walk() -> None:
    rng = np.random.default_rng(5)
    walk = np.maximum(200 + np.cumsum(rng.choice([-8, 0, 0, 0, 0, 8], 3 * PERIOD)), 0.0)
    group = fit_group(Series(walk, PERIOD), FINE, ForecastSettings(learned_need_price=False))
    assert group.model_name == "persistence"
    assert set(group.scores) >= {"persistence", "exp_smoothing", "ridge"}


def test_a_challenger_must_beat_persistence_by_the_margin() -> None:
    values, price = price_driven_demand(0)
    series = Series(values, PERIOD, price)
    chosen = fit_group(series, FINE, DEFAULT_SETTINGS)
    assert chosen.model_name == "ridge"
    ridge, persistence = chosen.scores["ridge"].pooled, chosen.scores["persistence"].pooled
    assert ridge < persistence
    # Demanding a larger gain than the ridge achieves keeps persistence.
    strict = ForecastSettings(choice_margin=min(0.99, 1 - ridge / persistence + 0.01))
    assert fit_group(Series(values, PERIOD, price), FINE, strict).model_name == "persistence"


def test_price_feature_lets_the_learned_model_beat_persistence_out_of_sample() -> None:
    values, price = price_driven_demand(2, steps=7 * PERIOD)
    fit_points = 6 * PERIOD
    with_price, mae, persistence_mae = holdout_mae(values, price, fit_points)
    assert with_price.model_name == "ridge"
    assert mae < 0.85 * persistence_mae
    without_price = fit_group(
        Series(values[:fit_points], PERIOD), FINE, ForecastSettings(learned_need_price=False)
    )
    assert with_price.scores["ridge"].pooled < without_price.scores["ridge"].pooled


def test_seasonal_pattern_picks_a_seasonal_model_for_the_day_ahead_curve() -> None:
    rng = np.random.default_rng(6)
    steps = 5 * PERIOD
    phase = 2 * np.pi * np.arange(steps) / PERIOD
    values = 100 + 60 * np.sin(phase) + rng.normal(0, 2, steps)
    coarse = np.arange(12, PERIOD + 1, 12)
    group = fit_group(Series(values, PERIOD), coarse, DEFAULT_SETTINGS)
    assert group.model_name != "persistence"
    assert group.scores[group.model_name].pooled < 0.5 * group.scores["persistence"].pooled


def test_intervals_cover_about_80_percent_out_of_sample() -> None:
    rng = np.random.default_rng(7)
    values = job_demand(rng, 12 * PERIOD, mean_gpus=150.0)
    fit_points = int(0.6 * values.size)
    group = fit_group(Series(values[:fit_points], PERIOD), FINE, DEFAULT_SETTINGS)
    origins = np.arange(fit_points, values.size - 12)
    low, median, high = group.predict(Series(values, PERIOD), origins)
    target = values[origins[:, None] + FINE[None, :]]
    coverage = np.mean((target >= low) & (target <= high))
    assert 0.72 <= coverage <= 0.88
    assert np.all(low <= median) and np.all(median <= high) and np.all(low >= 0)


def test_predictions_at_an_origin_ignore_everything_after_it() -> None:
    values, price = price_driven_demand(3, steps=5 * PERIOD)
    fit_points = 4 * PERIOD
    group = fit_group(Series(values[:fit_points], PERIOD, price[:fit_points]), FINE, DEFAULT_SETTINGS)
    cut = fit_points + 100
    altered_values, altered_price = values.copy(), price.copy()
    altered_values[cut + 1 :] = 0.0
    altered_price[cut + 1 :] *= 3.0
    origins = np.arange(fit_points, cut + 1)
    original = group.predict(Series(values, PERIOD, price), origins)
    altered = group.predict(Series(altered_values, PERIOD, altered_price), origins)
    for before, after in zip(original, altered):
        np.testing.assert_array_equal(before, after)
