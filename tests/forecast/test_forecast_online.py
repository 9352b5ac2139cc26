"""Online conformal tracking: coverage through regime changes, no look-ahead, live replay."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.forecast.backtest import backtest_series
from market_pipeline.forecast.online import track
from market_pipeline.forecast.pool import fit_and_forecast
from market_pipeline.forecast.settings import ForecastSettings
from market_pipeline.lab.forecast.synthetic import job_demand

Z90 = 1.2816


def regime_shift(rows: int = 4000, columns: int = 3, seed: int = 0) -> np.ndarray:
    """Residuals whose spread quadruples half way (a cluster changing regime)."""
    rng = np.random.default_rng(seed)
    half = rows // 2
    return np.vstack([rng.normal(0, 1, (half, columns)), rng.normal(0, 4, (rows - half, columns))])


def test_tracking_restores_coverage_after_a_regime_change() -> None:
    residuals = regime_shift()
    delays = np.array([1, 12, 48])
    start = (-Z90 * np.ones(3), Z90 * np.ones(3))  # split conformal on the calm regime
    tracked = track(residuals, *start, delays, rate=0.05)
    frozen = track(residuals, *start, delays, rate=0.0)
    after = slice(2500, None)  # the new regime, once the tracker has had time to react
    tracked_cover = tracked.inside(residuals)[after].mean(axis=0)
    frozen_cover = frozen.inside(residuals)[after].mean(axis=0)
    assert np.all((tracked_cover > 0.77) & (tracked_cover < 0.83)), tracked_cover
    assert np.all(frozen_cover < 0.4), frozen_cover  # split conformal alone under-covers
    assert tracked.steps == residuals.shape[0]
    assert np.all(tracked.upper > 3 * Z90)  # it widened to the new spread


def test_offsets_in_force_at_a_row_ignore_targets_not_yet_observed() -> None:
    residuals = regime_shift(rows=300, columns=2, seed=1)
    residuals[100] = 0.0  # covered in the base run ...
    delays = np.array([1, 12])
    base = track(residuals, -np.ones(2), np.ones(2), delays, rate=0.2)
    changed = residuals.copy()
    changed[100] = 50.0  # ... and a huge miss at origin 100 in the other, on both horizons
    moved = track(changed, -np.ones(2), np.ones(2), delays, rate=0.2)
    for column, delay in enumerate(delays):
        # Origin 100's target is observed at 100 + delay: nothing before may move.
        unchanged = slice(0, 100 + delay)
        assert np.array_equal(base.upper_used[unchanged, column], moved.upper_used[unchanged, column])
        assert moved.upper_used[100 + delay, column] > base.upper_used[100 + delay, column]


def _reference_track(residuals, lower, upper, delays, eta, min_half, windup):
    """The update rule row by row over every horizon at once, written for reading, not speed."""
    rows, columns = residuals.shape
    upper, lower = np.maximum(upper, min_half), np.minimum(lower, -min_half)
    upper_used, lower_used = np.empty((rows, columns)), np.empty((rows, columns))
    for now in range(rows + delays.max()):
        for column, delay in enumerate(delays):
            origin = now - delay  # the row whose target is observed now
            if 0 <= origin < rows:
                r = residuals[origin, column]
                upper[column] += eta[column] * ((r > upper_used[origin, column]) - 0.1)
                lower[column] -= eta[column] * ((r < lower_used[origin, column]) - 0.1)
                upper[column] = max(upper[column], -windup[column])
                lower[column] = min(lower[column], windup[column])
        if now < rows:
            upper_used[now] = np.maximum(upper, min_half)
            lower_used[now] = np.minimum(lower, -min_half)
    return lower_used, upper_used, np.minimum(lower, -min_half), np.maximum(upper, min_half)


def test_tracker_follows_its_update_rule_with_delayed_feedback() -> None:
    from market_pipeline.forecast.online import MIN_WIDTH_SHARE, WINDUP_WIDTHS, step_sizes

    rng = np.random.default_rng(4)
    # (rows, delays, share of ties); the last is quiet (its states wind up to the bank's edge),
    # then busy
    cases = (
        (0, [1, 3], 0.5),
        (5, [1, 12], 0.5),
        (200, [1, 2, 7, 12], 0.3),
        (60, [1, 24], 0.3),
        (300, [1, 6], 0.97),
    )
    for rows, delays, ties in cases:
        delays = np.array(delays)
        moved = rng.random((rows, delays.size)) > ties
        moved[rows // 2 :] |= ties > 0.9  # ... then busy: the banked credit delays the widening
        residuals = (
            rng.standard_normal((rows, delays.size)) * rng.choice([1.0, 4.0], (rows, delays.size)) * moved
        )
        lower0, upper0, width = -rng.random(delays.size), rng.random(delays.size), rng.random(delays.size) + 1
        tracked = track(residuals, lower0, upper0, delays, rate=0.2, width=width)
        expected = _reference_track(
            residuals,
            lower0.copy(),
            upper0.copy(),
            delays,
            step_sizes(width, delays, 0.2),
            0.5 * MIN_WIDTH_SHARE * width,
            WINDUP_WIDTHS * width,
        )
        for got, want in zip(
            (tracked.lower_used, tracked.upper_used, tracked.lower, tracked.upper), expected
        ):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert tracked.steps == rows


def test_interval_always_contains_the_point_and_never_collapses() -> None:
    residuals = np.zeros((500, 2))  # demand that never changes: every target is the point
    tracked = track(residuals, np.array([-1.0, -2.0]), np.array([1.0, 2.0]), np.array([1, 2]), rate=0.5)
    assert np.all(tracked.lower_used < 0) and np.all(tracked.upper_used > 0)
    assert tracked.inside(residuals).all()
    # ... and the offsets handed on to the next (live) interval keep their band, whatever
    # credit the state banked below it
    assert np.all(tracked.lower < 0) and np.all(tracked.upper > 0)


def test_rolling_backtest_holds_coverage_when_demand_doubles() -> None:
    rng = np.random.default_rng(5)
    values = np.concatenate(
        [job_demand(rng, 4 * 288, mean_gpus=60.0), job_demand(rng, 3 * 288, mean_gpus=150.0)]
    )
    settings = ForecastSettings(learned_models=())
    result = backtest_series(values, horizon_steps=12, settings=settings)
    frozen = backtest_series(
        values, horizon_steps=12, settings=ForecastSettings(learned_models=(), online_rate=0.0)
    )
    assert 0.75 <= result.coverage_80 <= 0.88, result.coverage_80
    assert abs(result.coverage_80 - 0.8) < abs(frozen.coverage_80 - 0.8) + 0.02
    assert result.refits == int(np.ceil(result.origins / 288))


def test_live_forecast_reports_the_steps_it_has_seen() -> None:
    history = job_demand(np.random.default_rng(2), 3 * 288, mean_gpus=80.0)
    forecast = fit_and_forecast(history)
    assert forecast.online_steps == 288  # one day of 5-minute rows replayed
    assert forecast.coarse_online_steps > 0
    assert forecast.recent_coverage is not None and forecast.recent_coverage.shape == (12,)
    assert np.all((forecast.recent_coverage >= 0) & (forecast.recent_coverage <= 1))
    off = fit_and_forecast(history, settings=ForecastSettings(online_rate=0.0))
    assert off.online_steps == 0 and off.recent_coverage is None


def test_fallback_forecast_has_seen_no_steps() -> None:
    forecast = fit_and_forecast(np.full(10, 5.0))
    assert forecast.online_steps == 0 and forecast.chosen_by == "fallback"


@pytest.mark.parametrize(
    "bad", [{"online_rate": -0.1}, {"online_window_rows": 0}, {"coverage_window_rows": 0}]
)
def test_online_settings_are_validated(bad: dict) -> None:
    from market_pipeline.forecast.settings import ForecastSettingsError

    with pytest.raises(ForecastSettingsError):
        ForecastSettings(**bad)


def lumpy_residuals(seed: int, rows: int = 6000, burst: int = 12) -> np.ndarray:
    """Demand that mostly does not change (~81% zero residuals); each change is a level jump
    that 12 consecutive origins of a 1 h horizon all miss (the Helios vcLJZ pattern)."""
    rng = np.random.default_rng(seed)
    residuals = np.zeros(rows)
    for start in rng.choice(rows - burst, size=rows * 2 // 10 // burst, replace=False):
        residuals[start : start + burst] = rng.choice([-1.0, 1.0]) * rng.uniform(2.0, 6.0)
    return residuals[:, None]


def test_wound_up_state_keeps_a_lumpy_series_near_its_best_coverage(monkeypatch) -> None:
    """An interval that keeps the point covers every zero residual, so ~81% is the least
    coverage possible; a state clamped at the floor over-covers after every burst."""
    from market_pipeline.forecast import online

    def excess(windup: float) -> float:
        monkeypatch.setattr(online, "WINDUP_WIDTHS", windup)
        gaps = []
        for seed in range(3):
            residuals = lumpy_residuals(seed)
            tracked = track(
                residuals, np.array([-2.0]), np.array([2.0]), np.array([12]), rate=0.05, width=np.array([4.0])
            )
            gaps.append(tracked.inside(residuals)[1000:].mean() - np.mean(residuals == 0))
        return float(np.mean(gaps))

    wound, clamped = excess(online.WINDUP_WIDTHS), excess(0.0)
    assert wound < 0.02, wound
    assert clamped > wound + 0.005, (clamped, wound)


def test_a_pool_calibrated_while_idle_still_adapts_when_it_turns_busy() -> None:
    """Calibrated on a spell where demand never changed (every residual 0, interval width 0),
    then residuals of spread 1 (normalised): the step must not be a share of that zero width
    (an openb series built from the Alibaba pod list covered 0.41 at 4 h that way)."""
    from market_pipeline.forecast.online import reference_width

    calm = np.zeros((500, 2))
    busy = np.random.default_rng(3).normal(0.0, 1.0, (3000, 2))
    width = reference_width(np.zeros(2), np.zeros(2), calm)
    tracked = track(busy, np.zeros(2), np.zeros(2), np.array([1, 12]), rate=0.05, width=width)
    cover = tracked.inside(busy)[1000:].mean(axis=0)
    assert np.all((cover > 0.77) & (cover < 0.83)), cover


def test_banked_credit_does_not_blind_a_quiet_pool_that_turns_busy() -> None:
    """A week where demand barely moves (4% of residuals, ±3) banks credit on both sides;
    when residuals of spread 3 arrive, the 1 h interval must widen within hours, not only
    after the bank is spent."""
    early, late = [], []
    for seed in range(2):
        rng = np.random.default_rng(seed)
        quiet = np.zeros((2000, 1))
        moved = rng.random(2000) < 0.04
        quiet[moved, 0] = rng.choice([-1.0, 1.0], moved.sum()) * 3.0
        residuals = np.vstack([quiet, rng.normal(0.0, 3.0, (1000, 1))])
        tracked = track(
            residuals, np.array([-1.0]), np.array([1.0]), np.array([12]), rate=0.05, width=np.array([3.0])
        )
        inside = tracked.inside(residuals)[:, 0]
        early.append(inside[2048:2096].mean())  # 4-8 h after the change
        late.append(inside[2096:].mean())
    assert np.mean(early) >= 0.3, early
    assert np.all(np.array(late) >= 0.75), late
