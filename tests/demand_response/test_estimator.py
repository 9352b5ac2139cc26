"""The fixed-effects estimator recovers a known elasticity where the price leans into the load."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.demand_response.estimator import DemandResponseInputError, fit_elasticity
from market_pipeline.demand_response.history import fit_history
from market_pipeline.lab.demand_response.synthetic import HistoryParams, deferred_history, synthetic_history


def _fit(frame, **kw):
    return next(iter(fit_history(frame, **kw).values()))


@pytest.mark.parametrize("elasticity", [0.2, 0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_recovers_each_constant_elasticity_within_15_percent(elasticity, seed):
    """Target 1: 14 days of 5-minute steps, the price leaning into the load, +-5% dither: within
    15%, or (at e 0.2, where 15% is about two standard errors) within three standard errors.
    5-minute data get 5-minute time-of-day effects."""
    fit = _fit(synthetic_history(HistoryParams(elasticity, days=14, step_minutes=5, dither=0.05, seed=seed)))
    assert fit.observations == 14 * 288
    error = abs(fit.elasticity - elasticity)
    assert error <= 0.15 * elasticity or (elasticity < 0.5 and error <= 3 * fit.std_error), fit
    assert fit.elasticity_low < fit.elasticity < fit.elasticity_high
    assert fit.hour_bins == 288 and fit.clusters == 14


def test_a_fit_ignoring_the_calendar_gets_the_sign_wrong():
    """Why the controls: demand on price alone reads the lean as 'price up, demand up'."""
    frame = synthetic_history(HistoryParams(0.5, days=14, step_minutes=60, seed=3))
    naive = -np.polyfit(np.log(frame["price"].to_numpy()), np.log(frame["demand"].to_numpy()), 1)[0]
    assert naive < 0
    assert abs(_fit(frame).elasticity / 0.5 - 1) < 0.5


def test_the_80_percent_interval_covers_about_80_percent():
    hits = 0
    for seed in range(100):
        fit = _fit(synthetic_history(HistoryParams(1.0, days=14, step_minutes=60, seed=seed)))
        hits += fit.elasticity_low <= 1.0 <= fit.elasticity_high
    assert 0.7 <= hits / 100 <= 0.9


def test_a_price_that_never_moves_identifies_nothing_and_falls_back_to_the_prior():
    frame = synthetic_history(HistoryParams(1.0, days=7, step_minutes=60, dither=0.0, lean=0.0))
    bare = _fit(frame)
    assert bare.elasticity is None and bare.method == "none" and "barely varies" in bare.reason
    with_prior = _fit(frame, priors={"A100@synthetic/drainable": (2.0, 1.0)})
    assert with_prior.method == "prior" and with_prior.elasticity == 2.0
    assert with_prior.elasticity_low < 2.0 < with_prior.elasticity_high


def test_the_prior_pulls_a_short_noisy_fit_toward_the_claims():
    frame = synthetic_history(HistoryParams(1.0, days=2, step_minutes=60, seed=5, noise=0.2))
    data = _fit(frame)
    shrunk = _fit(frame, priors={"A100@synthetic/drainable": (3.0, 0.5)})
    assert shrunk.method == "fe-ols+prior"
    assert min(data.elasticity, 3.0) <= shrunk.elasticity <= max(data.elasticity, 3.0)
    assert shrunk.width < data.width and shrunk.data_std_error == pytest.approx(data.std_error)


def test_rows_without_a_log_are_left_out_and_bad_shapes_are_refused():
    ts = np.arange(10) * 3600.0
    fit = fit_elasticity(ts, np.r_[np.ones(8), 0.0, -1.0], np.ones(10))
    assert fit.observations == 8
    with pytest.raises(DemandResponseInputError):
        fit_elasticity(ts, np.ones(9), np.ones(10))
    with pytest.raises(DemandResponseInputError):
        fit_elasticity(ts, np.ones(10), np.ones(10), level=1.5)


def test_a_perfect_fit_is_not_a_measurement():
    """Rows the controls and the price explain exactly leave no residual: the standard error
    would be 0 and swamp the prior, so the fit keeps the prior (seen on a sparse pool of the
    job-level simulator, whose demand did not move)."""
    import numpy as np

    from market_pipeline.demand_response.estimator import fit_elasticity

    ts = 3600.0 * np.arange(30)
    price = 1.0 + 0.05 * np.sin(np.arange(30))
    fit = fit_elasticity(ts, price, 3.0 * price**-1.0, prior=(0.2, 0.3))
    assert fit.method == "prior" and fit.elasticity == 0.2 and "perfect fit" in fit.reason
    noisy = fit_elasticity(
        ts, price, 3.0 * price**-1.0 * np.exp(np.random.default_rng(0).normal(0, 0.01, 30)), prior=(0.2, 0.3)
    )
    assert noisy.method == "fe-ols+prior" and noisy.data_elasticity is not None


def test_deferred_work_makes_the_hourly_response_overstate_and_the_lag_corrects_it():
    """Work a high price turns away waits and buys at the next lower price: the hour-to-hour
    dither then reads several times the tenants' own elasticity. The distributed lag (the mean
    log price over the last 3 hours) moves the fit back toward it, and says it used the lag."""
    for seed in range(3):
        frame = deferred_history(1.0, seed=seed)
        hourly, lagged = _fit(frame), _fit(frame, lag_hours=3)
        assert hourly.elasticity > 2.5 and hourly.lag_hours == 0
        assert lagged.lag_hours == 3
        assert abs(lagged.elasticity - 1.0) < 0.5 * abs(hourly.elasticity - 1.0)


def test_the_lag_is_dropped_where_the_data_show_no_deferral():
    """No deferral (5-minute steps, the target's histories): the lag's coefficient is not
    significant, the fit keeps the price now only and its precision (within three standard
    errors of the truth), and no cycle."""
    for elasticity in (0.2, 1.0, 3.0):
        frame = synthetic_history(HistoryParams(elasticity, days=14, step_minutes=5, seed=0))
        fit = _fit(frame, lag_hours=3, daily_cycle=True)
        assert fit.lag_hours == 0 and fit.elasticity_cos == fit.elasticity_sin == 0.0
        assert abs(fit.elasticity - elasticity) <= 3 * fit.std_error
        assert fit.std_error == pytest.approx(_fit(frame).std_error, rel=0.05)


def test_a_structure_alpha_of_one_keeps_the_lag_and_pays_its_variance():
    """`structure_alpha` 1: the lag stays on data without deferral too. The long-run elasticity
    is still unbiased there, with a wider interval than the price-now fit's (the default test
    drops it)."""
    frame = synthetic_history(HistoryParams(1.0, days=14, step_minutes=60, seed=0))
    tested = _fit(frame, lag_hours=3, structure_alpha=0.1)
    kept = _fit(frame, lag_hours=3, structure_alpha=1.0)
    assert tested.lag_hours == 0 and kept.lag_hours == 3
    assert kept.data_std_error > tested.data_std_error
    assert abs(kept.data_elasticity - 1.0) < 3 * kept.data_std_error
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(DemandResponseInputError, match="structure_alpha"):
            _fit(frame, lag_hours=3, structure_alpha=bad)


def test_the_daily_cycle_of_the_elasticity_is_recovered():
    """e(h) = 1 + 0.3 cos + 0.2 sin: the fit reads the mean and the cycle; the tick's hour
    reads the elasticity of that hour."""
    frame = synthetic_history(HistoryParams(1.0, days=14, step_minutes=5, seed=0, cycle=(0.3, 0.2)))
    fit = _fit(frame, daily_cycle=True)
    assert abs(fit.elasticity - 1.0) < 0.1
    assert abs(fit.elasticity_cos - 0.3) < 0.1 and abs(fit.elasticity_sin - 0.2) < 0.1
    assert fit.at_hour(0) > fit.at_hour(12) + 0.4  # cos 0 = 1, cos 180 = -1
    flat = _fit(frame)
    assert flat.elasticity_cos == 0.0 and flat.at_hour(0) == flat.at_hour(12)


def test_a_kept_cycle_is_shrunk_by_the_prior():
    frame = synthetic_history(
        HistoryParams(1.0, days=2, step_minutes=60, seed=5, noise=0.2, cycle=(0.6, -0.6))
    )
    raw = _fit(frame, daily_cycle=True, structure_alpha=1.0)
    shrunk = _fit(
        frame, daily_cycle=True, structure_alpha=1.0, priors={"A100@synthetic/drainable": (1.0, 0.1)}
    )
    assert abs(shrunk.elasticity_cos) < abs(raw.elasticity_cos)
    assert abs(shrunk.elasticity_sin) < abs(raw.elasticity_sin)


def test_the_fit_records_the_low_end_of_the_prices_it_observed_and_only_a_data_fit_offers_it():
    """`price_low` is the (1 - level) / 2 quantile of the prices of the rows the fit used (rows
    without a log left out); `observed_at` offers it with the interval's lower bound where the
    data spoke, and nothing where the prior alone speaks."""
    frame = synthetic_history(HistoryParams(2.0, days=7, step_minutes=60, seed=4, dither=0.05))
    prices = frame["price"].to_numpy()
    fit = _fit(frame)
    assert fit.price_low == pytest.approx(float(np.exp(np.quantile(np.log(prices), 0.1))), rel=1e-9)
    assert prices.min() < fit.price_low < np.median(prices)
    assert fit.observed_at(3.0) == (fit.price_low, pytest.approx(fit.elasticity_low))
    assert fit.observed_at(3.0, "central") == (fit.price_low, pytest.approx(fit.elasticity))
    wider = _fit(frame, level=0.95)
    assert wider.price_low == pytest.approx(float(np.exp(np.quantile(np.log(prices), 0.025))), rel=1e-9)
    still = synthetic_history(HistoryParams(1.0, days=7, step_minutes=60, dither=0.0, lean=0.0))
    prior_only = _fit(still, priors={"A100@synthetic/drainable": (2.0, 1.0)})
    assert prior_only.method == "prior" and prior_only.observed_at(3.0) is None
