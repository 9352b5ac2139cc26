"""Price experiments stay inside every promise; the tick calibrates the tenants to the fit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from market_pipeline.demand_response.estimator import ResponseFit
from market_pipeline.demand_response.experiments import (
    ExperimentSettings,
    ExperimentSettingsError,
    dither_sign,
    interval_narrow,
    perturb_tick,
)
from market_pipeline.lab.demand_response.truth import grid_market
from market_pipeline.lab.demand_response.truth_grid import pool_inputs, promise_breaches
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.solve import demand_at
from market_pipeline.tick import Promises, run_market_tick
from market_pipeline.tick.response import calibrated_to_response

PROMISES = Promises()
MARKET = grid_market(PROMISES.discount_min, PROMISES.discount_max)
KEYS = set(MARKET.keys)


def _problem(elasticity, scale=1.0):
    pop = MARKET.population(np.asarray(elasticity, dtype=float), scale)
    return MARKET.with_capacity(
        MarketProblem(MARKET.resources, pop), MARKET.capacity(scale * MARKET.base_demand[0::2])
    )


def _tick(in_force, elasticity=(0.2, 2.0, 0.2, 2.0), response=None):
    inputs = pool_inputs(MARKET, in_force, MARKET.base_demand, MARKET.base_demand, PROMISES)
    return run_market_tick(inputs, _problem(elasticity), PROMISES, response=response), inputs


def test_calibration_keeps_the_level_and_takes_the_fitted_slope():
    claims = _problem([0.2, 2.0, 0.2, 2.0])
    fitted = {"A100@grid/drainable": 0.7, "T4@grid/guaranteed": 0.05}
    problem = calibrated_to_response(claims, MARKET.reference, fitted)
    at_ref = demand_at(problem, MARKET.reference)
    assert at_ref == pytest.approx(demand_at(claims, MARKET.reference), rel=1e-6)
    bump = MARKET.reference * np.exp(np.where(np.arange(4) >= 0, 1e-4, 0))
    local = -(np.log(demand_at(problem, bump)) - np.log(at_ref)) / 1e-4
    assert local[1] == pytest.approx(0.7, rel=1e-2) and local[2] == pytest.approx(0.05, rel=2e-2)
    assert local[0] == pytest.approx(0.2, rel=1e-2) and local[3] == pytest.approx(
        2.0, rel=1e-2
    )  # claims kept


def test_the_tick_prices_the_fit_not_the_claims():
    """An elastic class fitted far less elastic than the claims is priced higher."""
    claims_tick, _ = _tick(MARKET.reference)
    fitted_tick, _ = _tick(MARKET.reference, response={"A100@grid/drainable": 0.3, "T4@grid/drainable": 0.3})
    assert fitted_tick.prices()[1::2].sum() > claims_tick.prices()[1::2].sum() * 1.05
    assert fitted_tick.prices()[0::2] == pytest.approx(claims_tick.prices()[0::2], rel=1e-3)


def test_the_tick_anchors_the_fit_where_the_caller_states_the_level():
    """`level_prices` defaults to the live calibration's reference; another anchor (here the
    list price of both classes) moves the fitted curve and so the drainable price. At e = 3
    the curve through the claims' (e = 2) demand at the middle of the band falls below their
    list-price demand up the band; the curve through the list price keeps that demand, and
    the tick prices drainable higher."""
    response = {"A100@grid/drainable": 3.0, "T4@grid/drainable": 3.0}
    default, inputs = _tick(MARKET.reference, response=response)
    problem = _problem((0.2, 2.0, 0.2, 2.0))
    same = run_market_tick(inputs, problem, PROMISES, response=response, level_prices=MARKET.reference)
    assert same.prices() == pytest.approx(default.prices(), rel=1e-9)
    lists = np.array([p.list_price for p in inputs for _ in range(2)])
    at_list = run_market_tick(inputs, problem, PROMISES, response=response, level_prices=lists)
    assert np.all(at_list.prices()[1::2] > default.prices()[1::2] * 1.1)
    assert at_list.prices()[0::2] == pytest.approx(default.prices()[0::2], rel=1e-6)


@pytest.mark.parametrize("level", [0.6, 1.0, 1.04])
def test_experiment_prices_keep_every_promise(level):
    """From prices in force at, below and at the cap, every experiment price keeps the cap,
    the max step and the band; the dither moves the price where the window allows."""
    in_force = MARKET.reference * np.repeat([level, level], 2)
    tick, inputs = _tick(in_force)
    moved_any = 0
    for slot in range(40):
        moved, steps = perturb_tick(tick, inputs, PROMISES, KEYS, ExperimentSettings(amplitude=0.05), slot)
        assert promise_breaches(MARKET, PROMISES, in_force, moved.prices()) == 0
        assert len(steps) == 4
        for s in steps:
            assert abs(s.price / s.base_price - 1) <= 0.05 + 1e-12
            moved_any += s.price != s.base_price
    assert moved_any > 40


def test_no_experiment_goes_below_a_shielded_price():
    tick, inputs = _tick(MARKET.reference)
    shielded = replace(tick, pools=tuple(replace(r, shield_factor=1.2) for r in tick.pools))
    for slot in range(20):
        moved, _ = perturb_tick(shielded, inputs, PROMISES, KEYS, ExperimentSettings(), slot)
        assert (moved.prices()[0::2] >= shielded.prices()[0::2] - 1e-12).all()


def test_signs_are_randomised_across_pools_and_hours():
    signs = np.array([[dither_sign(0, k, h) for k in sorted(KEYS)] for h in range(400)])
    assert abs(signs.mean()) < 0.1
    assert abs(np.corrcoef(signs[:, 0], signs[:, 1])[0, 1]) < 0.15
    assert abs(np.corrcoef(signs[:-1, 0], signs[1:, 0])[0, 1]) < 0.15


def test_an_experiment_stops_when_the_datas_interval_is_narrow():
    settings = ExperimentSettings(stop_relative_width=0.3, stop_absolute_width=0.2)
    wide = ResponseFit(
        "p", "drainable", 2.0, 1.0, 3.0, 100, std_error=0.1, data_std_error=0.5, data_elasticity=2.0
    )
    narrow = replace(wide, data_std_error=0.2)  # 80%: 2 x 1.28 x 0.2 = 0.51 <= 0.3 x 2
    assert not interval_narrow(wide, settings) and interval_narrow(narrow, settings)
    assert not interval_narrow(replace(wide, data_std_error=None, method="prior"), settings)


def test_an_experiment_stops_when_its_interval_decides_the_price():
    """Every elasticity in [e - 1.28 se, e + 1.28 se] puts the Lerner price above the ceiling:
    the price is the ceiling whatever the truth, so the experiment stops."""
    settings = ExperimentSettings()
    inelastic = ResponseFit("p", "guaranteed", 0.3, None, None, 50, data_std_error=0.4, data_elasticity=0.3)
    assert not interval_narrow(inelastic, settings)  # wide: 1.02 > max(0.09, 0.2)
    assert interval_narrow(inelastic, settings, unit_cost=1.0, ceiling=3.12)  # e_high 0.81 <= 1
    elastic = replace(inelastic, data_elasticity=2.0)  # e_high 2.51: Lerner 1.66 x cost
    assert not interval_narrow(elastic, settings, unit_cost=1.0, ceiling=3.12)
    assert interval_narrow(elastic, settings, unit_cost=2.0, ceiling=3.12)


def test_amplitude_is_bounded():
    with pytest.raises(ExperimentSettingsError):
        ExperimentSettings(amplitude=0.5)


def test_the_price_book_names_an_experiment_price_as_such():
    from market_pipeline.tick.live import price_source

    tick, inputs = _tick(MARKET.reference)
    moved, steps = perturb_tick(tick, inputs, PROMISES, KEYS, ExperimentSettings(), slot=1)
    r = moved.pools[0]
    assert price_source("converged", r.guaranteed_reason, r.shield_factor, r.certified) == "experiment"
    assert price_source("converged", "as solved", 1.0, True) == "solver"


def test_the_fitted_representative_keeps_the_claims_budget():
    """Claims whose money runs out 10% above their spend at the reference: a fit of e = 3 takes
    the slope, not the money. Below the reference the representative buys at most budget / p
    (a fitted e > 1 no longer reads 'revenue grows without bound as the price falls'); claims
    whose budget never binds leave the slope alone (and so does a fit at or below 1)."""
    from market_pipeline.market.solve import tenant_demand_at
    from market_pipeline.tick.response import claims_budget, response_population

    res, ref, d0 = MARKET.resources, MARKET.reference, MARKET.base_demand
    fitted = list(enumerate(np.array([0.2, 2.0, 0.2, 2.0])))
    tight = MarketProblem(res, response_population(res, ref, d0, fitted, budgets=1.1 * ref * d0))
    loose = MarketProblem(res, response_population(res, ref, d0, fitted))
    money = claims_budget(tight, ref, tenant_demand_at(tight, ref))
    assert money[1::2] == pytest.approx(1.1 * ref[1::2] * d0[1::2], rel=1e-6)  # the e = 2 claims' money
    key = "A100@grid/drainable"
    half = ref.copy()
    half[1] *= 0.5
    bound = demand_at(calibrated_to_response(tight, ref, {key: 3.0}), half)[1]
    free = demand_at(calibrated_to_response(loose, ref, {key: 3.0}), half)[1]
    assert bound == pytest.approx(1.1 * ref[1] * d0[1] / half[1], rel=1e-3)  # the budget binds
    assert free > 2 * bound  # the fitted slope alone: 4.7 x d0 at half the price
    assert demand_at(calibrated_to_response(tight, ref, {key: 3.0}), ref)[1] == pytest.approx(d0[1], rel=1e-6)
    low_fit = demand_at(calibrated_to_response(tight, ref, {key: 0.8}), half)[1]
    assert low_fit == pytest.approx(
        demand_at(calibrated_to_response(loose, ref, {key: 0.8}), half)[1]
    )  # e <= 1: none


def test_observed_spend_lifts_the_representatives_budget_down_to_the_lowest_observed_price():
    """The claims' money runs out 10% above their spend at the reference, but the fit (e = 3,
    its interval's lower bound 3 too) observed demand down to 0.6 x the reference: there the
    representative buys what the fitted curve says (spend 1.8x the claims' money), and only
    below that price does the money bind (at the spend observed there). A lowest observed
    price at or above the reference, or a lower bound of 1 (spend does not grow as the price
    falls), leaves the claims' budget as it was."""
    from market_pipeline.tick.response import observed_budget, response_population

    res, ref, d0 = MARKET.resources, MARKET.reference, MARKET.base_demand
    fitted = list(enumerate(np.array([0.2, 2.0, 0.2, 2.0])))
    tight = MarketProblem(res, response_population(res, ref, d0, fitted, budgets=1.1 * ref * d0))
    key = "A100@grid/drainable"
    low = ref.copy()
    low[1] *= 0.6
    observed = calibrated_to_response(tight, ref, {key: 3.0}, {key: (float(low[1]), 3.0)})
    claims_only = calibrated_to_response(tight, ref, {key: 3.0})
    curve = d0[1] * (2 * (1 / 0.6) ** 1.5 - 1)  # the representative's: d0 (2 (p0 / p)^(e / 2) - 1)
    assert demand_at(observed, low)[1] == pytest.approx(curve, rel=1e-3)  # the fitted curve
    assert demand_at(claims_only, low)[1] == pytest.approx(1.1 * ref[1] * d0[1] / low[1], rel=1e-3)
    assert demand_at(observed, low)[1] > 1.7 * demand_at(claims_only, low)[1]
    half = ref.copy()
    half[1] *= 0.5
    spend = observed_budget(float(ref[1]), float(d0[1]), 3.0, float(low[1]))
    assert spend == pytest.approx(low[1] * curve, rel=1e-9)
    assert demand_at(observed, half)[1] == pytest.approx(spend / half[1], rel=1e-3)  # money binds below
    assert demand_at(observed, ref)[1] == pytest.approx(d0[1], rel=1e-6)  # the level is kept
    above = calibrated_to_response(tight, ref, {key: 3.0}, {key: (float(ref[1] * 1.2), 3.0)})
    assert demand_at(above, half)[1] == pytest.approx(demand_at(claims_only, half)[1], rel=1e-9)
    unsure = calibrated_to_response(tight, ref, {key: 3.0}, {key: (float(low[1]), 1.0)})
    assert demand_at(unsure, half)[1] == pytest.approx(demand_at(claims_only, half)[1], rel=1e-9)


def test_the_tick_sells_deeper_where_spend_was_observed_at_a_deeper_price():
    """Claims whose money binds at the reference, a fit of e = 3 on the drainable classes: with
    the claims' budget the spend is flat below the reference and the tick keeps the drainable
    price up; where the fit observed demand at the band's floor, the deeper price sells more
    and the tick prices drainable lower."""
    res, ref, d0 = MARKET.resources, MARKET.reference, MARKET.base_demand
    fitted = list(enumerate(np.array([0.2, 2.0, 0.2, 2.0])))
    tight = MarketProblem(res, response_population_tight(res, ref, d0, fitted))
    problem = MARKET.with_capacity(tight, 4.0 * d0)  # room for either class to sell more
    inputs = pool_inputs(MARKET, ref, d0, d0, PROMISES)
    response = {"A100@grid/drainable": 3.0, "T4@grid/drainable": 3.0}
    floor = {k: (float(min(res.price_min)), 3.0) for k in response}
    claims = run_market_tick(inputs, problem, PROMISES, response=response)
    observed = run_market_tick(inputs, problem, PROMISES, response=response, observed=floor)
    assert np.all(observed.prices()[1::2] < claims.prices()[1::2] * 0.99)
    sold = demand_at(problem, observed.prices())[1::2]
    assert np.all(sold > demand_at(problem, claims.prices())[1::2])


def response_population_tight(res, ref, d0, fitted):
    from market_pipeline.tick.response import response_population

    return response_population(res, ref, d0, fitted, budgets=1.0 * ref * d0)


def test_the_posterior_interval_stops_an_experiment_the_claims_and_data_decide():
    """Wide data (a rigid class at its cap) but claims of 0.2 +- 0.3: the posterior's high end
    is below 1, the price is the cap whatever, and a dither that can only go down stops."""
    settings = ExperimentSettings()
    wide_data = ResponseFit("p", "guaranteed", 0.25, 0.0, 0.6, 100, data_std_error=0.8, data_elasticity=0.4)
    assert interval_narrow(wide_data, settings, unit_cost=0.3, ceiling=3.12)
    undecided = replace(wide_data, elasticity=2.0, elasticity_low=1.5, elasticity_high=2.5)
    assert not interval_narrow(undecided, settings, unit_cost=0.3, ceiling=3.12)


def test_a_drainable_price_moved_by_the_guaranteed_experiment_says_why():
    """Only the guaranteed class experiments: where its move pulls the drainable band past the
    drainable price, the drainable price moves too, and its reason says so (it was labelled
    'as solved', source 'solver', 5% under the solver's price)."""
    from market_pipeline.tick.live import price_source

    in_force = MARKET.reference.copy()
    solved, inputs = _tick(in_force)
    # the solver's drainable price at the top of its band: a guaranteed price 5% lower moves it
    top = tuple(replace(r, drainable=r.guaranteed * (1 - PROMISES.discount_min)) for r in solved.pools)
    tick = replace(solved, pools=top)
    g_only = {k for k in KEYS if k.endswith("/guaranteed")}
    moved_drainable = 0
    for slot in range(40):
        moved, _ = perturb_tick(tick, inputs, PROMISES, g_only, ExperimentSettings(amplitude=0.05), slot)
        for before, after in zip(tick.pools, moved.pools):
            if abs(after.drainable - before.drainable) > 1e-12:
                moved_drainable += 1
                assert "experiment" in after.drainable_reason
                source = price_source(
                    "converged", after.drainable_reason, after.shield_factor, after.certified
                )
                assert source == "experiment"
            else:
                assert after.drainable_reason == before.drainable_reason
    assert moved_drainable > 0  # the case happens on this market


def test_a_shield_that_finds_no_price_counts_as_shielded() -> None:
    """The shield finding no certifying price publishes the window's top: even where the solver
    was already there (factor 1), the pool counts as shielded, as its reason says."""
    from market_pipeline.tick import PoolTickRecord

    base = dict(
        pool_id="p",
        list_price=2.0,
        solver_guaranteed=2.08,
        solver_drainable=1.2,
        guaranteed=2.08,
        drainable=1.2,
        guaranteed_reason="backlog shield: no price up to the guaranteed cap 2.08 drains the backlog",
        drainable_reason="as solved",
        certified=False,
        margin=-3.0,
        required_margin=0.25,
        serving_gpus=8.0,
        capacity_target_gpus=16.0,
        equilibrium_price=2.08,
    )
    assert PoolTickRecord(**base).shielded
    assert not PoolTickRecord(**{**base, "certified": True, "margin": 1.0}).shielded
