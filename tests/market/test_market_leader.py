"""The leader: global optimality on small instances, constraints, live ticks."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import numpy as np
import pytest
from market_test_helpers import grid_demand, grid_profit, resource, tenant
from scipy.optimize import minimize

import market_pipeline.market.solve as solve_module
from market_pipeline.lab.market.generate import random_problem
from market_pipeline.market.errors import InstanceError
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import SolverSettings
from market_pipeline.market.solve import resolve_device, solve_equilibrium
from market_pipeline.market.workspace import pooled_bytes


def _small_problem(seed: int, m: int, capacities, band=None) -> MarketProblem:
    rng = np.random.default_rng(seed)
    tenants = []
    for j in range(18):
        family = ["log", "isoelastic", "quadratic"][j % 3]
        extra = {"eta": float(rng.uniform(0.5, 1.8))} if family == "isoelastic" else {}
        sat = rng.uniform(0.5, 2.0, m)
        choke = rng.uniform(2.0, 6.0, m)
        weight = choke if family == "quadratic" else choke * sat
        tenants.append(
            tenant(
                f"t{j}",
                weight.tolist(),
                sat.tolist(),
                float(rng.uniform(2.0, 8.0)),
                family,
                delay_cost=float(rng.uniform(0, 0.2)),
                **extra,
            )
        )
    resources = [resource(f"r{i}", capacities[i], 1.0 + 0.2 * i, 0.5, 8.0) for i in range(m)]
    if band is not None:
        resources[0].update({"class": "guaranteed", "pool": "p"})
        resources[1].update({"class": "drainable", "pool": "p", "discount_band": band})
    return MarketProblem.from_instance_json({"resources": resources, "tenants": tenants})


def test_profit_matches_a_dense_grid_search_on_two_resources():
    free = _small_problem(0, 2, [None, None])
    demand_free = solve_equilibrium(free).demand
    problem = _small_problem(0, 2, [0.7 * demand_free[0], None])  # the first capacity binds
    report = solve_equilibrium(problem)
    assert report.converged and report.kkt_residual <= 1e-6
    axis = np.linspace(0.5, 8.0, 41)
    grid = np.array(np.meshgrid(axis, axis)).reshape(2, -1).T
    profits = grid_profit(problem, grid)
    best = grid[np.argmax(profits)]
    fine_axes = [np.linspace(max(0.5, b - 0.2), min(8.0, b + 0.2), 41) for b in best]
    fine = np.array(np.meshgrid(*fine_axes)).reshape(2, -1).T
    grid_best = max(profits.max(), grid_profit(problem, fine).max())
    assert report.profit >= grid_best * (1 - 1e-3)
    assert report.profit <= grid_best * (1 + 1e-3)  # the grid gets close, so the check has teeth
    np.testing.assert_allclose(grid_demand(problem, report.prices[None])[0], report.demand, rtol=1e-6)


def test_profit_matches_multistart_slsqp_with_a_discount_band():
    free = _small_problem(1, 3, [None] * 3, band=[0.2, 0.5])
    demand_free = solve_equilibrium(free).demand
    problem = _small_problem(1, 3, [0.6 * demand_free[0], None, 0.8 * demand_free[2]], band=[0.2, 0.5])
    report = solve_equilibrium(problem)
    assert report.converged
    g, d = report.prices[0], report.prices[1]
    assert 0.5 * g - 1e-9 <= d <= 0.8 * g + 1e-9
    res = problem.resources

    def negative_profit(p):
        return -float(((p - res.unit_cost) * grid_demand(problem, p[None])[0]).sum())

    constraints = [
        {
            "type": "ineq",
            "fun": lambda p: np.nan_to_num(res.capacity, posinf=1e12) - grid_demand(problem, p[None])[0],
        },
        {"type": "ineq", "fun": lambda p: np.array([p[1] - 0.5 * p[0], 0.8 * p[0] - p[1]])},
    ]
    best = -np.inf
    for start in np.random.default_rng(7).uniform(1.0, 6.0, (4, 3)):
        start[1] = 0.65 * start[0]
        out = minimize(
            negative_profit,
            start,
            method="SLSQP",
            bounds=[(0.5, 8.0)] * 3,
            constraints=constraints,
            options={"ftol": 1e-12, "maxiter": 300},
        )
        if out.success:
            best = max(best, -out.fun)
    assert np.isfinite(best)
    assert report.profit >= best * (1 - 1e-3)


def test_random_instance_respects_capacity_bounds_and_bands():
    problem = random_problem(300, 8, seed=11)
    report = solve_equilibrium(problem)
    res = problem.resources
    assert report.converged and report.kkt_residual <= 1e-6 and report.follower_kkt <= 1e-6
    assert np.all(report.demand <= res.capacity * (1 + 1e-6))
    assert np.any(report.demand >= res.capacity * (1 - 1e-6))  # some capacity binds
    assert np.all(report.prices >= res.price_min) and np.all(report.prices <= res.price_max)
    for pair in res.band_pairs:
        pg, pd = report.prices[pair.guaranteed], report.prices[pair.drainable]
        assert (1 - pair.discount_max) * pg - 1e-9 <= pd <= (1 - pair.discount_min) * pg + 1e-9
    json.dumps(report.to_dict(), allow_nan=False)


def test_live_tick_limits_the_price_step_and_warm_starts():
    problem = random_problem(200, 6, seed=3)
    first = solve_equilibrium(problem)
    mild = solve_equilibrium(problem.with_demand_scale(1.05), last_prices=first.prices, max_step=0.2)
    assert mild.converged
    assert np.all(np.abs(mild.prices - first.prices) <= 0.2 * first.prices + 1e-12)
    assert np.any(mild.prices > first.prices * (1 + 1e-4))  # more demand, higher prices
    cold = solve_equilibrium(problem.with_demand_scale(1.05))
    np.testing.assert_allclose(mild.prices, cold.prices, rtol=1e-6)  # the step did not bind
    warm = solve_equilibrium(problem.with_demand_scale(1.05), last_prices=cold.prices)
    assert warm.converged and warm.iterations <= 1


def test_surge_beyond_the_step_raises_prices_by_the_full_step():
    problem = random_problem(200, 6, seed=3)
    first = solve_equilibrium(problem)
    tick = solve_equilibrium(problem.with_demand_scale(1.3), last_prices=first.prices, max_step=0.05)
    assert tick.status == "capacity_infeasible" and not tick.converged and tick.fallback_reason is None
    assert np.all(np.abs(tick.prices - first.prices) <= 0.05 * first.prices + 1e-12)
    oversold = [problem.resources.index(name) for name in tick.oversold]
    assert oversold
    np.testing.assert_allclose(tick.prices[oversold], 1.05 * first.prices[oversold], rtol=1e-9)


def test_subsampled_warm_start_reaches_the_same_equilibrium():
    problem = random_problem(600, 6, seed=5)
    direct = solve_equilibrium(problem)
    staged = solve_equilibrium(problem, settings=SolverSettings(coarse_threshold=100, coarse_tenants=64))
    assert staged.converged
    np.testing.assert_allclose(staged.prices, direct.prices, rtol=1e-6)
    # the global phase ran on the subsample, and the report says what it searched
    assert staged.starts >= 2 and staged.screened_prices > 0


def test_a_solve_keeps_its_working_memory_on_its_own_device_for_the_next() -> None:
    """The (N, M) buffers a solve needed stay pooled for the next solve of that width on the
    device it ran on: what ``bench solver`` reports as ``workspace_bytes`` (at least one
    float64 N x M array), and on a GPU what keeps the next tick from allocating again."""
    problem = random_problem(100, 13, seed=1)
    report = solve_equilibrium(problem, device="cpu")
    assert report.device == "cpu" and report.converged
    assert pooled_bytes(13, resolve_device("cpu")) >= 8 * 100 * 13


def test_a_market_no_larger_than_the_coarse_threshold_is_solved_whole() -> None:
    """The coarse pass is for markets above ``coarse_threshold`` tenants: a cold solve of a
    market of exactly that size searches the market itself, so its report (prices, leader and
    follower iterations, the search's starts and screened prices) is the one the default
    settings give, whatever subsample size the staged path would have used."""
    problem = random_problem(64, 3, seed=4)
    plain = solve_equilibrium(problem)
    at_threshold = solve_equilibrium(problem, settings=SolverSettings(coarse_threshold=64, coarse_tenants=64))
    assert plain.converged and at_threshold.converged
    np.testing.assert_array_equal(at_threshold.prices, plain.prices)
    seen = {
        k: getattr(at_threshold, k)
        for k in ("iterations", "follower_iterations", "starts", "screened_prices")
    }
    assert seen == {k: getattr(plain, k) for k in seen}


@pytest.mark.parametrize("max_iterations", [2, 4])
def test_a_staged_solve_spends_the_coarse_pass_from_its_iteration_budget(max_iterations: int) -> None:
    """``max_iterations`` is what one start may spend, the coarse pass on the subsample
    included: a staged cold solve (one start, no global phase) that runs out reports exactly
    that many leader iterations and falls back, not the budget again on top of the coarse pass."""
    problem = random_problem(600, 6, seed=5)
    settings = SolverSettings(
        coarse_threshold=100, coarse_tenants=64, global_phase=False, max_iterations=max_iterations
    )
    report = solve_equilibrium(problem, settings=settings)
    assert report.status == "fallback" and report.fallback_reason.startswith("no convergence within")
    assert report.iterations == max_iterations
    unlimited = solve_equilibrium(problem, settings=dataclasses.replace(settings, max_iterations=500))
    assert (
        unlimited.converged and unlimited.iterations > max_iterations
    )  # the budget, not the solve, ended it


def test_a_warm_solve_from_its_own_optimum_holds_still() -> None:
    """A tick whose market has not moved since the last certified prices keeps them at no
    cost: no leader step, no coarse pass, no global search (that is for cold solves)."""
    problem = random_problem(60, 3, seed=2)
    cold = solve_equilibrium(problem)
    assert cold.status == "converged"
    warm = solve_equilibrium(problem, last_prices=cold.prices, max_step=0.25)
    assert warm.status == "converged" and warm.iterations == 0
    assert warm.starts == 1 and warm.screened_prices == 0 and warm.distinct_optima == 1
    np.testing.assert_allclose(warm.prices, cold.prices, rtol=1e-12)


def test_fallback_returns_the_last_prices_with_a_reason():
    problem = random_problem(150, 6, seed=2)
    last = 0.5 * (problem.resources.price_min + problem.resources.price_max)
    report = solve_equilibrium(problem, last_prices=last, settings=SolverSettings(max_iterations=1))
    assert report.status == "fallback" and not report.converged
    assert "no convergence" in report.fallback_reason
    np.testing.assert_array_equal(report.prices, last)
    assert np.all(np.isfinite(report.demand))
    json.dumps(report.to_dict(), allow_nan=False)


def test_fallback_without_last_prices_is_a_safe_in_bounds_price(monkeypatch):
    import market_pipeline.market.solve as solve_module
    from market_pipeline.market.errors import SolverError

    def broken(*args, **kwargs):
        raise SolverError("injected failure")

    monkeypatch.setattr(solve_module, "run_leader", broken)
    problem = random_problem(100, 4, seed=1)
    report = solve_equilibrium(problem)
    assert report.status == "fallback" and "injected failure" in report.fallback_reason
    res = problem.resources
    assert np.all(np.isfinite(report.prices)) and np.all(report.prices > 0)
    assert np.all(report.prices <= res.price_max) and np.all(report.prices >= res.price_min)
    assert np.all(report.demand <= problem.with_demand_scale(1.0).resources.capacity * (1 + 1e-9))


def test_a_cold_fallback_with_nothing_visited_still_keeps_the_drainable_band(monkeypatch):
    """Without prices in force and without any feasible point visited, the fallback publishes
    price_max moved into the discount band: the drainable price stays 20-50% under the
    guaranteed one (price_max on both would sell drainable capacity at the guaranteed price)."""
    from market_pipeline.market.errors import SolverError

    def broken(*args, **kwargs):
        raise SolverError("injected failure")

    monkeypatch.setattr(solve_module, "run_leader", broken)
    problem = _small_problem(2, 3, [None] * 3, band=[0.2, 0.5])
    report = solve_equilibrium(problem)
    assert report.status == "fallback" and "injected failure" in report.fallback_reason
    guaranteed, drainable = report.prices[0], report.prices[1]
    assert np.all(np.isfinite(report.prices)) and drainable < guaranteed
    assert 0.5 * guaranteed * (1 - 1e-9) <= drainable <= 0.8 * guaranteed * (1 + 1e-9)
    assert np.all(report.prices <= problem.resources.price_max)
    assert np.all(report.prices >= problem.resources.price_min)


def test_capacity_infeasible_within_price_bounds_is_reported():
    tenants = [tenant(f"t{j}", [10.0], [5.0]) for j in range(5)]
    problem = MarketProblem.from_instance_json(
        {"resources": [resource("gpu", 1.0, 0.5, 0.1, 0.8)], "tenants": tenants}
    )
    report = solve_equilibrium(problem)
    assert report.status == "capacity_infeasible" and not report.converged
    assert report.prices[0] == pytest.approx(0.8)
    assert set(report.oversold) == {"gpu"}
    assert report.fallback_reason is None
    # the shortfall is what the solve proves, not a residual: the report certifies on the
    # leader's stationarity, complementarity and its followers, the violation stands apart
    assert report.capacity_violation > 0.1
    assert report.kkt_residual <= 1e-6


def test_tight_discount_band_fixes_the_drainable_price():
    problem = _small_problem(2, 3, [None] * 3, band=[0.3, 0.3])
    report = solve_equilibrium(problem)
    assert report.converged
    assert report.prices[1] == pytest.approx(0.7 * report.prices[0], rel=1e-9)


def test_cuda_request_without_cuda_is_a_clear_error():
    import torch

    from market_pipeline.market.errors import InstanceError

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(InstanceError, match="device"):
        solve_equilibrium(random_problem(10, 2, 0), device="cuda")


def test_optimum_at_a_kink_is_reached_and_certified():
    # with few tenants the profit bends where a budget switches between binding and slack; here
    # the optimum sits on such a kink, where no single gradient vanishes
    problem = random_problem(30, 2, seed=5)
    report = solve_equilibrium(problem)
    assert report.converged and report.nonsmooth and report.kkt_residual <= 1e-6
    res = problem.resources
    axes = [np.linspace(p - 0.03 * p, p + 0.03 * p, 41) for p in report.prices]
    grid = np.array(np.meshgrid(*axes)).reshape(2, -1).T
    grid = grid[np.all((grid >= res.price_min) & (grid <= res.price_max), axis=1)]
    grid = grid[(grid[:, 1] >= 0.4 * grid[:, 0]) & (grid[:, 1] <= 0.8 * grid[:, 0])]  # the generator's band
    assert report.profit >= grid_profit(problem, grid).max() * (1 - 1e-6)


def test_pieces_carried_along_a_ridge_steer_but_do_not_certify():
    """A piece's gradient carried by accepted steps keeps steering the max-min model, but once
    the point is farther than KINK_RADIUS from where the piece was sampled it no longer counts
    for the kink certificate (a first-order extrapolation is not a sampled gradient)."""
    from market_pipeline.market.leader_kinks import KINK_RADIUS, kink_gradients, recentred, sampled_near

    span = np.ones(2)
    sampled = np.array([1.0, 1.0])
    hessian = np.array([[-2.0, 0.0], [0.0, -1.0]])
    bundle = [(sampled, np.array([0.5, -0.25]), hessian, sampled)]
    far = sampled + np.array([3 * KINK_RADIUS, 0.0])
    assert kink_gradients(bundle, far, span) is None  # not carried: out of reach
    carried_bundle = recentred(bundle, far)
    np.testing.assert_allclose(kink_gradients(carried_bundle, far, span)[0], [0.5 - 6 * KINK_RADIUS, -0.25])
    assert sampled_near(carried_bundle, far, span) == []
    assert len(sampled_near(carried_bundle, sampled + 0.5 * KINK_RADIUS, span)) == 1


# Acceptance: a converged leader is certified only when its followers pass the KKT test too.
def _three_tenants() -> MarketProblem:
    tenants = [
        tenant("a", [4.0, 3.0], [1.0, 1.5], 6.0, "log"),
        tenant("b", [2.0, 5.0], [0.8, 1.2], None, "quadratic"),
        tenant("c", [3.0, 2.0], [1.2, 0.9], 3.0, "isoelastic", eta=1.2),
    ]
    resources = [resource("r0", None, 0.5, 0.2, 20.0), resource("r1", None, 0.6, 0.2, 20.0)]
    return MarketProblem.from_instance_json({"resources": resources, "tenants": tenants})


@pytest.fixture
def followers_off_by(monkeypatch):
    """The leader converges as usual, but its followers' residual is off by `excess`."""

    def install(excess: float) -> None:
        real = solve_module.follower_kkt_residual
        monkeypatch.setattr(
            solve_module, "follower_kkt_residual", lambda pop, state: real(pop, state) + excess
        )

    return install


def test_followers_exactly_at_the_tolerance_are_accepted(monkeypatch) -> None:
    """The certificate's bound is inclusive: a residual equal to the tolerance certifies."""
    settings = SolverSettings()
    monkeypatch.setattr(solve_module, "follower_kkt_residual", lambda pop, state: settings.tolerance)
    report = solve_equilibrium(
        _three_tenants(), last_prices=np.array([2.0, 2.0]), max_step=0.25, settings=settings
    )
    assert report.status == "converged" and report.fallback_reason is None
    assert report.follower_kkt == settings.tolerance


def test_a_converged_leader_whose_followers_are_off_is_not_accepted(followers_off_by) -> None:
    problem, last = _three_tenants(), np.array([2.0, 2.0])
    settings = SolverSettings()
    good = solve_equilibrium(problem, last_prices=last, max_step=0.25, settings=settings)
    assert good.status == "converged" and good.follower_kkt <= settings.tolerance
    followers_off_by(10 * settings.tolerance)  # ten times the tolerance: far below 100x
    report = solve_equilibrium(problem, last_prices=last, max_step=0.25, settings=settings)
    assert report.status == "fallback" and not report.converged
    assert "followers' KKT residual" in report.fallback_reason
    np.testing.assert_allclose(report.prices, last)  # the prices in force stay


def test_a_fallback_at_the_optimum_reports_the_optimums_capacity_price(followers_off_by) -> None:
    """The fallback's diagnostics are of the prices it returns: refused at the very prices a
    converged solve found (a tight capacity, its shadow price well above 10 / price_max), it
    reports that solve's capacity price and a leader at rest, not a distorted step's."""
    free = _small_problem(0, 2, [None, None])
    problem = _small_problem(0, 2, [0.25 * solve_equilibrium(free).demand[0], None])
    optimum = solve_equilibrium(problem)
    assert optimum.status == "converged" and optimum.capacity_price[0] > 1.5
    followers_off_by(10 * SolverSettings().tolerance)
    report = solve_equilibrium(problem, last_prices=optimum.prices, max_step=0.25)
    assert report.status == "fallback"
    np.testing.assert_array_equal(report.prices, optimum.prices)
    np.testing.assert_allclose(report.capacity_price, optimum.capacity_price, rtol=1e-6, atol=1e-9)
    assert report.leader_stationarity <= 1e-8


def test_a_tick_refused_while_oversold_reports_the_oversold_capacity_price_a_certified_one_does(
    followers_off_by,
) -> None:
    """A surge beyond the step oversells resources even at the highest price the step allows;
    the certified tick reports their capacity price as the price box's penalty. The same tick
    refused (its followers off) keeps the prices in force and reports, for the same oversold
    resources under the same box, the same capacity price, not a different penalty's."""
    problem = random_problem(200, 6, seed=3)
    first = solve_equilibrium(problem)
    surged = problem.with_demand_scale(1.3)
    tick = solve_equilibrium(surged, last_prices=first.prices, max_step=0.05)
    assert tick.status == "capacity_infeasible"
    oversold = [surged.resources.index(name) for name in tick.oversold]
    assert oversold and np.all(tick.capacity_price[oversold] > tick.prices.max())  # no price clears them
    followers_off_by(1.0)
    refused = solve_equilibrium(surged, last_prices=first.prices, max_step=0.05)
    assert refused.status == "fallback" and "followers' KKT residual" in refused.fallback_reason
    np.testing.assert_array_equal(refused.prices, first.prices)
    assert sorted(refused.oversold) == sorted(tick.oversold)
    np.testing.assert_allclose(refused.capacity_price[oversold], tick.capacity_price[oversold], rtol=1e-9)


def test_followers_within_tolerance_are_accepted(followers_off_by) -> None:
    settings = SolverSettings()
    followers_off_by(0.5 * settings.tolerance)
    report = solve_equilibrium(
        _three_tenants(), last_prices=np.array([2.0, 2.0]), max_step=0.25, settings=settings
    )
    assert report.status == "converged" and report.follower_kkt <= settings.tolerance


def test_a_fallback_keeps_last_prices_only_inside_the_price_bounds():
    """Prices in force from before the bounds moved are published clipped into them, and the
    report says plainly that nothing converged and no optimum was found."""
    problem = random_problem(60, 4, seed=3)
    res = problem.resources
    last = np.array([0.5 * res.price_min[0], 2.0 * res.price_max[1], res.price_min[2], res.price_max[3]])
    report = solve_equilibrium(problem, last_prices=last, settings=SolverSettings(max_iterations=1))
    assert report.status == "fallback" and report.converged is False
    np.testing.assert_array_equal(report.prices, [res.price_min[0], res.price_max[1], last[2], last[3]])
    assert report.distinct_optima == 0 and np.all(np.isfinite(report.demand))
    assert report.follower_kkt <= SolverSettings().tolerance  # the diagnostics are of the prices returned


def test_a_cold_fallback_reports_the_search_it_ran():
    problem = random_problem(60, 3, seed=4)
    report = solve_equilibrium(problem, settings=SolverSettings(max_iterations=1))
    assert report.status == "fallback" and report.converged is False
    # the global phase tried two starts and screened prices; neither start converged
    assert report.starts == 2 and report.screened_prices > 0 and report.distinct_optima == 0
    # it publishes the most profitable capacity-feasible point the search visited: prices that
    # sell within capacity, not price_max, where no tenant here buys anything
    capacity = problem.resources.capacity
    assert np.all(report.demand <= capacity * (1 + 1e-9)) and report.profit > 0
    assert not np.any(solve_module.demand_at(problem, problem.resources.price_max))


# Markets the step cannot move: every price fixed by its bounds, or held by a zero step.
def _fixed_price_market(capacity) -> MarketProblem:
    tenants = [tenant(f"t{j}", [4.0 + j, 3.0], [1.0, 1.5], 6.0, "log") for j in range(4)]
    resources = [resource("r0", capacity, 0.5, 2.0, 2.0), resource("r1", None, 0.6, 3.0, 3.0)]
    return MarketProblem.from_instance_json({"resources": resources, "tenants": tenants})


@pytest.mark.parametrize("capacity", [None, 0.5])
def test_prices_fixed_by_their_bounds_are_published_as_they_are(capacity) -> None:
    """price_min == price_max on every resource (the catalog allows it): there is nothing to
    choose, and the solve says so: those prices, certified, no iteration (it used to raise a
    numpy ValueError from the empty step QP when no capacity binds)."""
    problem = _fixed_price_market(capacity)
    status = "converged" if capacity is None else "capacity_infeasible"
    for kwargs in ({}, {"last_prices": np.array([2.0, 3.0]), "max_step": 0.25}):
        report = solve_equilibrium(problem, **kwargs)
        assert report.status == status and report.fallback_reason is None, report.fallback_reason
        np.testing.assert_array_equal(report.prices, [2.0, 3.0])
        assert report.iterations == 0 and report.kkt_residual <= SolverSettings().tolerance


def test_a_zero_step_holds_every_price_where_it_stands() -> None:
    """max_step = 0 (accepted: "finite and >= 0") freezes the prices in force: a certified
    tick at exactly those prices, not a crash."""
    problem = _small_problem(2, 3, [None] * 3, band=[0.3, 0.3])
    last = np.array([2.0, 1.4, 2.0])  # the drainable price 30% under the guaranteed one
    report = solve_equilibrium(problem, last_prices=last, max_step=0.0)
    assert report.status == "converged" and report.iterations == 0
    np.testing.assert_array_equal(report.prices, last)


@pytest.mark.parametrize("max_step", [0.0, 0.01])
def test_a_start_the_promises_cannot_hold_falls_back_at_once_naming_why(max_step) -> None:
    """Prices in force that break the drainable band while the step holds them (still, or
    within 1%): no solve can start; the prices in force stay, not the step box's top, with the
    constraint's own words as the reason."""
    problem = _small_problem(2, 3, [None] * 3, band=[0.3, 0.3])
    last = np.array([2.0, 1.9, 2.0])
    report = solve_equilibrium(problem, last_prices=last, max_step=max_step)
    assert report.status == "fallback" and report.converged is False and report.iterations == 0
    assert report.fallback_reason.startswith(
        "SolverError: price constraints: the drainable band cannot be met inside the price/step box"
    )
    np.testing.assert_array_equal(report.prices, last)
    assert report.distinct_optima == 0 and np.all(np.isfinite(report.demand))


def test_the_report_states_the_worst_certified_residual_and_what_the_solve_did() -> None:
    """kkt_residual is the worst of the parts the status is certified on: stationarity,
    complementarity, feasibility and the followers' residual for a solution; the same less the
    capacity shortfall (which the status reports) for a capacity-infeasible one."""
    problem = random_problem(80, 3, seed=2)
    before = time.perf_counter()
    report = solve_equilibrium(problem)
    assert 0 < report.seconds <= time.perf_counter() - before  # the solve's own wall time
    assert report.status == "converged"
    parts = (report.leader_stationarity, report.leader_complementarity, report.capacity_violation)
    assert report.kkt_residual == max(*parts, report.follower_kkt)
    assert report.tenants == problem.tenants.size and report.device == "cpu"
    assert report.iterations >= 1 and report.follower_iterations >= report.iterations
    assert report.seconds > 0
    np.testing.assert_array_equal(report.capacity, problem.resources.capacity)
    served = np.minimum(report.demand, problem.resources.capacity)
    assert report.profit == pytest.approx(float((report.prices - problem.resources.unit_cost) @ served))
    tenants = [tenant(f"t{j}", [10.0], [5.0]) for j in range(5)]
    short = solve_equilibrium(
        MarketProblem.from_instance_json(
            {"resources": [resource("gpu", 1.0, 0.5, 0.1, 0.8)], "tenants": tenants}
        )
    )
    assert short.status == "capacity_infeasible" and short.capacity_violation > 0.1
    assert short.kkt_residual == max(
        short.leader_stationarity, short.leader_complementarity, short.follower_kkt
    )
    assert short.profit == pytest.approx((0.8 - 0.5) * 1.0)  # only the capacity is sold


def test_the_followers_refusal_names_their_residual(followers_off_by) -> None:
    settings = SolverSettings()
    followers_off_by(10 * settings.tolerance)
    report = solve_equilibrium(
        _three_tenants(), last_prices=np.array([2.0, 2.0]), max_step=0.25, settings=settings
    )
    assert report.status == "fallback"
    assert re.fullmatch(r"followers' KKT residual \d\.\d\de-\d\d above tolerance", report.fallback_reason)
    residual = float(report.fallback_reason.split()[3])
    assert 10 * settings.tolerance <= residual <= 11 * settings.tolerance  # the leader's point's, as refused


@pytest.mark.parametrize("failing", ["evaluate", "local_model"])
def test_a_fallback_whose_diagnostics_fail_publishes_its_prices_and_says_nothing_is_known(
    monkeypatch, failing
) -> None:
    """The fallback evaluates its prices to report on them; when that evaluation fails it
    still returns the prices in force, and what it could not measure reads as unknown (no
    demand, no profit) or infinitely far from certified, never as a small number."""
    from market_pipeline.market.errors import SolverError

    def broken(*args, **kwargs):
        raise SolverError("injected failure")

    problem = random_problem(60, 3, seed=4)
    last = 0.5 * (problem.resources.price_min + problem.resources.price_max)
    monkeypatch.setattr(solve_module, failing, broken)
    report = solve_equilibrium(problem, last_prices=last, settings=SolverSettings(max_iterations=1))
    assert (
        report.status == "fallback"
        and report.converged is False
        and "no convergence" in report.fallback_reason
    )
    np.testing.assert_array_equal(report.prices, last)
    assert report.leader_stationarity == report.leader_complementarity == report.capacity_violation == np.inf
    assert report.kkt_residual == np.inf
    np.testing.assert_array_equal(report.capacity_price, np.zeros(3))
    body = report.to_dict()
    json.dumps(body, allow_nan=False)
    assert body["kkt_residual"] is None and body["leader_stationarity"] is None
    if failing == "evaluate":  # nothing measured at all
        assert np.all(np.isnan(report.demand)) and np.isnan(report.profit) and body["profit"] is None
        assert report.follower_kkt == np.inf and report.budget_bound_tenants == 0
    else:  # the followers were evaluated; only the leader's local model failed
        assert np.all(np.isfinite(report.demand)) and np.isfinite(report.profit)
        assert report.follower_kkt <= SolverSettings().tolerance


def test_a_time_budget_stops_the_solve_and_a_generous_one_changes_nothing() -> None:
    """time_budget_s is wall-clock from the call: spent before the first step, the prices in
    force stay and the reason says why; ten minutes leave the solve as it is without one."""
    problem = random_problem(60, 3, seed=4)
    last = 0.5 * (problem.resources.price_min + problem.resources.price_max)
    free = solve_equilibrium(problem, last_prices=last, max_step=0.25)
    roomy = solve_equilibrium(
        problem, last_prices=last, max_step=0.25, settings=SolverSettings(time_budget_s=600.0)
    )
    assert free.status == roomy.status == "converged" and free.iterations >= 1
    np.testing.assert_allclose(roomy.prices, free.prices, rtol=1e-12)
    spent = solve_equilibrium(
        problem, last_prices=last, max_step=0.25, settings=SolverSettings(time_budget_s=1e-9)
    )
    assert spent.status == "fallback" and spent.fallback_reason.startswith("time budget exhausted")
    np.testing.assert_array_equal(spent.prices, last)


def test_extra_starts_are_solved_from_and_the_best_one_wins() -> None:
    """A cold solve's extra starts (what global_resolve passes: the prices in force) each run
    a local solve: one in a better optimum's basin lifts the profit above the local solve
    alone, one on the no-sale plateau at price_max is moved off it and solved too, and the
    report counts the starts and the distinct optima."""
    from market_pipeline.lab.market.generate import coupled_problem
    from market_pipeline.market.resolve import global_resolve

    problem = coupled_problem(24, 2, 0)
    local_only = SolverSettings(global_phase=False)
    local = solve_equilibrium(problem, settings=local_only)
    better = global_resolve(problem)
    assert better.profit > local.profit * (1 + 1e-3)  # two optima: the start decides
    starts = [better.prices, problem.resources.price_max]
    report = solve_equilibrium(problem, settings=local_only, extra_starts=starts)
    assert report.status == "converged" and report.starts == 3 and report.distinct_optima == 2
    assert report.profit >= better.profit * (1 - 1e-9)
    with pytest.raises(InstanceError, match=r"^extra_starts: only for cold solves \(without last_prices\)$"):
        solve_equilibrium(problem, last_prices=report.prices, extra_starts=starts)
