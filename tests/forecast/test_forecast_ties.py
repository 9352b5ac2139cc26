"""Ties (demand that did not move) and the coverage check: a full or idle pool's intervals
cover almost every target whatever they do, so the check's upper end rises with the tie
floor; under-coverage is judged as before."""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np
import pytest

from market_pipeline.forecast.online import tie_floor
from market_pipeline.forecast.operator import coverage_check, operator_metadata, tie_floor_at, upper_band
from market_pipeline.forecast.pool import fit_and_forecast
from market_pipeline.forecast.pools import PoolResult


def test_tie_floor_lets_each_side_miss_at_most_its_ten_percent() -> None:
    still = np.zeros(100)
    balanced = np.concatenate([np.full(50, 1.0), np.full(50, -1.0)])
    rare_rise = np.concatenate([np.full(3, 2.0), np.zeros(97)])
    floors = tie_floor(np.column_stack([still, balanced, rare_rise]))
    np.testing.assert_allclose(floors, [1.0, 0.8, 0.97])
    assert np.isnan(tie_floor(np.empty((0, 2)))).all()


def full_pool(seed: int, days: float = 5.0, capacity: float = 64.0) -> np.ndarray:
    """A pool that is always full: now and then an 8-GPU job ends and its slot is refilled
    10-30 minutes later (a saturated virtual cluster, like Helios Earth's vcgkz)."""
    rng = np.random.default_rng(seed)
    demand = np.full(int(days * 288), capacity)
    for start in np.flatnonzero(rng.random(demand.size) < 0.004):
        demand[start : start + rng.integers(2, 7)] -= 8.0
    return demand


def full_fleet() -> list[PoolResult]:
    results = []
    for seed in range(3):
        history = full_pool(seed)
        forecast = fit_and_forecast(history)
        results.append(PoolResult(f"full-{seed}", dt.datetime(2026, 1, 1), history, None, forecast))
    return results


@pytest.fixture(scope="module")
def fleet() -> list[PoolResult]:
    return full_fleet()


def test_a_full_fleet_reads_its_tie_floor_and_passes(fleet: list[PoolResult]) -> None:
    for result in fleet:
        floor = tie_floor_at(result.forecast, 60)
        assert floor is not None and floor > 0.9  # demand did not move at most origins
    checked = coverage_check(fleet)
    assert checked.passed, checked.reason
    assert "ties floor" in checked.reason
    metadata = operator_metadata(fleet)
    assert metadata["rolling_coverage_80_60m"] > 0.9
    assert metadata["rolling_tie_floor_80_60m"] > 0.9
    assert "tie_floor_80_60m" in metadata["forecast_operator_table"]


def test_without_the_floor_the_same_fleet_would_fail(fleet: list[PoolResult]) -> None:
    """The false alarm this fixes: coverage above 0.9 only because the demand sat still."""
    blind = [
        dataclasses.replace(
            r, forecast=dataclasses.replace(r.forecast, recent_tie_floor=None, coarse_recent_tie_floor=None)
        )
        for r in fleet
    ]
    checked = coverage_check(blind)
    assert not checked.passed and "60 min" in checked.reason


def _forced(result: PoolResult, coverage: float, floor: float) -> PoolResult:
    forecast = dataclasses.replace(
        result.forecast,
        recent_coverage=np.full(12, coverage),
        coarse_recent_coverage=np.full(24, coverage),
        recent_tie_floor=np.full(12, floor),
        coarse_recent_tie_floor=np.full(24, floor),
    )
    return dataclasses.replace(result, forecast=forecast)


def test_ties_do_not_excuse_under_coverage(fleet: list[PoolResult]) -> None:
    checked = coverage_check([_forced(r, 0.6, 0.97) for r in fleet])
    assert not checked.passed and "0.600" in checked.reason


@pytest.mark.parametrize(
    ("coverage", "floor", "passes"),
    [(0.95, 0.8, False), (0.95, 0.9, True), (0.99, 0.97, True), (0.8, 0.8, True), (0.69, 0.97, False)],
)
def test_only_coverage_well_above_the_floor_is_too_wide(
    fleet: list[PoolResult], coverage: float, floor: float, passes: bool
) -> None:
    assert coverage_check([_forced(r, coverage, floor) for r in fleet]).passed is passes


def test_upper_band_rises_with_the_floor_only() -> None:
    assert upper_band(0.8) == pytest.approx(0.9)
    assert upper_band(0.75) == pytest.approx(0.9)
    assert upper_band(0.97) == pytest.approx(1.07)
