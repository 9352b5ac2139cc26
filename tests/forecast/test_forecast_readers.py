"""Horizon readers, the survival + arrival candidate and the operator view."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from market_pipeline.forecast.features import Series
from market_pipeline.forecast.horizons import quantile_at, upper_quantile_at
from market_pipeline.forecast.operator import coverage_check, operator_metadata
from market_pipeline.forecast.pool import fit_and_forecast
from market_pipeline.forecast.pools import forecast_pool_results
from market_pipeline.forecast.settings import ForecastInputError, ForecastSettings
from market_pipeline.forecast.survival import DemandContext, SurvivalArrival
from market_pipeline.lab.forecast.synthetic import job_demand, synthetic_demand_table


@pytest.fixture(scope="module")
def results() -> list:
    return forecast_pool_results(synthetic_demand_table(3, days=3.0, seed=4))


def test_upper_quantile_reads_fine_then_coarse_and_interpolates(results: list) -> None:
    forecast = results[0].forecast
    assert upper_quantile_at(results[0], 30) == pytest.approx(forecast.q90[5])
    assert upper_quantile_at(forecast, 240) == pytest.approx(forecast.coarse_q90[3])
    between = upper_quantile_at(forecast, 210)
    assert between == pytest.approx(0.5 * (forecast.coarse_q90[2] + forecast.coarse_q90[3]))
    assert upper_quantile_at(forecast, 1) == pytest.approx(forecast.q90[0])
    assert quantile_at(forecast, 120, "q50") == pytest.approx(forecast.coarse_q50[1])


@pytest.mark.parametrize("minutes", [0, -5, float("nan"), 24 * 60 + 1])
def test_upper_quantile_rejects_horizons_it_does_not_hold(results: list, minutes: float) -> None:
    with pytest.raises(ForecastInputError):
        upper_quantile_at(results[0], minutes)


def test_quantile_at_rejects_unknown_levels_and_objects(results: list) -> None:
    with pytest.raises(ForecastInputError, match="level"):
        quantile_at(results[0], 60, "q75")  # type: ignore[arg-type]
    with pytest.raises(ForecastInputError, match="PoolForecast"):
        upper_quantile_at({"q90": 1.0}, 60)


def test_residual_survival_of_exponential_lifetimes() -> None:
    lifetimes = np.random.default_rng(0).exponential(60.0, 20_000)
    context = DemandContext(lifetimes, np.array([]), np.array([]))
    # Memoryless: the running demand decays like a fresh task, exp(-h / mean).
    assert context.residual_survival(np.array([60.0, 120.0])) == pytest.approx(np.exp([-1.0, -2.0]), abs=0.02)


def test_running_tasks_survive_by_their_ages() -> None:
    context = DemandContext(
        lifetime_minutes=np.array([60.0, 60.0, 180.0, 180.0]),
        running_age_minutes=np.array([0.0, 100.0]),
        running_gpus=np.array([8.0, 4.0]),
    )
    # The new task lives 60 or 180 min (half each); the 100-min-old one must be a 180-min
    # task, so it survives 70 more minutes but not 90.
    assert context.surviving_running(np.array([30.0, 70.0, 90.0])) == pytest.approx([12.0, 8.0, 4.0])


def test_survival_candidate_uses_ages_at_the_newest_origin_only() -> None:
    values = np.full(400, 20.0)
    values[::7] = 22.0
    series = Series(values, 288)
    context = DemandContext(
        np.array([60.0, 600.0]), np.array([0.0]), np.array([20.0]), arrival_gpus_per_minute=0.0
    )
    model = SurvivalArrival(48, 5, context)
    horizons = np.array([6, 24])  # 30 min and 2 h
    assert model.fit(series, np.arange(48, 370), horizons)
    newest = model.predict(series, np.array([len(series) - 1]), horizons)[0]
    assert newest == pytest.approx([20.0, 10.0])  # half the lifetimes end within 2 h
    past = model.predict(series, np.array([200]), horizons)[0]
    assert np.all(past > 18.0)  # past origins: equilibrium survival around the trailing level


def test_context_input_is_checked() -> None:
    with pytest.raises(ForecastInputError, match="lifetime"):
        DemandContext(np.array([]), np.array([]), np.array([]))
    with pytest.raises(ForecastInputError, match="equal length"):
        DemandContext(np.array([5.0]), np.array([1.0, 2.0]), np.array([1.0]))
    with pytest.raises(ForecastInputError, match="arrival"):
        DemandContext(np.array([5.0]), np.array([]), np.array([]), arrival_gpus_per_minute=-1)


def test_fit_and_forecast_accepts_a_context() -> None:
    history = job_demand(np.random.default_rng(1), 3 * 288, mean_gpus=50.0)
    context = DemandContext(
        np.random.default_rng(2).pareto(1.8, 500) * 600 + 5,
        np.array([10.0, 300.0]),
        np.array([float(history[-1]) / 2] * 2),
    )
    forecast = fit_and_forecast(history, context=context)
    assert forecast.q90.shape == (12,) and np.all(forecast.q90 >= forecast.q50)


def test_operator_metadata_lists_every_pool_with_coverage(results: list) -> None:
    metadata = operator_metadata(results)
    table = metadata["forecast_operator_table"]
    assert all(result.pool_id in table for result in results)
    assert "coverage_80_60m" in table and "chosen_by" in table
    assert sum(metadata["models_chosen"].values()) == len(results)
    assert 0.0 <= metadata["rolling_coverage_80_60m"] <= 1.0


def _with_coverage(result, value: float, reason: str | None = None):
    forecast = dataclasses.replace(
        result.forecast,
        recent_coverage=np.full(12, value),
        coarse_recent_coverage=np.full(24, value),
        fallback_reason=reason,
    )
    return dataclasses.replace(result, forecast=forecast)


def test_coverage_check_passes_in_band_and_fails_outside(results: list) -> None:
    good = coverage_check([_with_coverage(r, 0.8) for r in results])
    assert good.passed and "within" in good.reason and not good.warnings
    low = coverage_check([_with_coverage(r, 0.6) for r in results])
    assert not low.passed and "0.600" in low.reason and "60 min" in low.reason
    mixed = coverage_check(
        [_with_coverage(results[0], 0.95), _with_coverage(results[1], 0.75), _with_coverage(results[2], 0.75)]
    )
    assert mixed.passed and any(results[0].pool_id in w for w in mixed.warnings)


def test_coverage_check_warns_on_fallback_persistence(results: list) -> None:
    checked = coverage_check([_with_coverage(results[0], 0.8, reason="short history")])
    assert checked.passed
    assert checked.warnings == [f"{results[0].pool_id}: persistence by fallback (short history)"]


def _pool(forecast, name: str = "pool-a"):
    import datetime as dt

    from market_pipeline.forecast.pools import PoolResult

    return PoolResult(name, dt.datetime(2026, 1, 1), np.zeros(1), None, forecast)


def test_zero_demand_before_a_pool_first_had_demand_is_not_history() -> None:
    """The demo's demand grid is zero-filled for days before the fleet started: those ties
    were the calibration and the rolling coverage (1.0 at 4 h). They are dropped."""
    live = job_demand(np.random.default_rng(7), 2 * 288, mean_gpus=40.0)
    padded = fit_and_forecast(np.concatenate([np.zeros(3 * 288), live]))
    alone = fit_and_forecast(live)
    assert padded.history_points == alone.history_points == live.size
    np.testing.assert_allclose(padded.q90, alone.q90)
    np.testing.assert_allclose(padded.recent_coverage, alone.recent_coverage)
    # a pool that never had demand still falls back on its (constant) history
    idle = fit_and_forecast(np.zeros(600))
    assert idle.chosen_by == "fallback" and "constant" in idle.fallback_reason


def test_coverage_check_fails_on_a_truly_miscalibrated_forecast() -> None:
    """Demand whose volatility quadruples for its last day, intervals calibrated on the
    calm days and (almost) not adapting: its own rolling coverage puts it outside the band;
    the same demand with the default tracking passes."""
    rng = np.random.default_rng(11)
    steps = np.concatenate([rng.normal(0.0, 1.0, 5 * 288), rng.normal(0.0, 4.0, 288)])
    demand = 200.0 + np.cumsum(steps)
    frozen = ForecastSettings(online_rate=1e-6)
    miscalibrated = coverage_check([_pool(fit_and_forecast(demand, settings=frozen))])
    assert not miscalibrated.passed and "60 min" in miscalibrated.reason
    assert coverage_check([_pool(fit_and_forecast(demand))]).passed


def test_coverage_check_names_the_horizons_it_could_not_judge() -> None:
    """Under a day of demand: the 1 h path is tracked, the hourly curve (4 h) is not yet."""
    young = fit_and_forecast(job_demand(np.random.default_rng(5), 250, mean_gpus=30.0))
    assert young.recent_coverage is not None and young.coarse_recent_coverage is None
    checked = coverage_check([_pool(young)])
    assert "60 min" in checked.reason and "not judged yet: 240 min" in checked.reason


def test_coverage_check_does_not_judge_a_handful_of_independent_targets() -> None:
    """Six hours of demand: ~60 rows at 1 h are ~5 non-overlapping targets, too few to tell
    0.8 from 0.3; a day's rows (24 of them) are judged and fail the same coverage."""
    young = fit_and_forecast(job_demand(np.random.default_rng(6), 80, mean_gpus=30.0))
    day = fit_and_forecast(job_demand(np.random.default_rng(6), 300, mean_gpus=30.0))
    assert 0 < young.online_steps < 100 and day.online_steps >= 200

    def at(forecast, value: float):
        return _pool(dataclasses.replace(forecast, recent_coverage=np.full(forecast.q50.size, value)))

    unjudged = coverage_check([at(young, 0.3)])
    assert unjudged.passed and "too few to judge" in unjudged.reason
    assert not coverage_check([at(day, 0.3)]).passed
