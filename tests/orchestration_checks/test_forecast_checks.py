"""demand_forecast's two checks: rolling 80% coverage within 0.7-0.9 (ERROR), persistence
chosen by fallback (WARN), from the forecast's own operator view."""

from __future__ import annotations

import dataclasses

import dagster as dg
import numpy as np
import pytest

from assets.market.checks import FORECAST_COVERAGE, FORECAST_FALLBACK, forecast_check_results
from market_pipeline.forecast.pools import forecast_pool_results
from market_pipeline.lab.forecast.synthetic import synthetic_demand_table


@pytest.fixture(scope="module")
def results() -> list:
    return forecast_pool_results(synthetic_demand_table(2, days=2.0, seed=7))


def covered(result, value: float, reason: str | None = None):
    forecast = dataclasses.replace(
        result.forecast,
        recent_coverage=np.full(result.forecast.q50.size, value),
        coarse_recent_coverage=np.full(result.forecast.coarse_q50.size, value),
        fallback_reason=reason,
    )
    return dataclasses.replace(result, forecast=forecast)


def by_name(checks) -> dict[str, dg.AssetCheckResult]:
    return {c.check_name: c for c in checks}


def test_coverage_in_band_passes_and_outside_fails(results) -> None:
    good = by_name(forecast_check_results([covered(r, 0.8) for r in results]))
    assert good[FORECAST_COVERAGE].passed and good[FORECAST_FALLBACK].passed
    assert good[FORECAST_COVERAGE].metadata["rolling_coverage_80_60m"].value == pytest.approx(0.8)
    wide = by_name(forecast_check_results([covered(r, 0.97) for r in results]))[FORECAST_COVERAGE]
    assert not wide.passed and wide.severity is dg.AssetCheckSeverity.ERROR and "0.970" in wide.description


def test_persistence_by_fallback_raises_a_warning(results) -> None:
    checks = by_name(
        forecast_check_results(
            [covered(results[0], 0.8, reason="history too short"), covered(results[1], 0.8)]
        )
    )
    warning = checks[FORECAST_FALLBACK]
    assert not warning.passed and warning.severity is dg.AssetCheckSeverity.WARN
    assert "history too short" in warning.description and warning.metadata["fallback_pools"].value == 1
