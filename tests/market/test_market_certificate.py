"""The solver's certificate: the followers' KKT residual away from the best response, and a
solve that is accepted only when its followers pass it too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from market_test_helpers import mixed_population, resource, tenant

import market_pipeline.market.solve as solve_module
from market_pipeline.market import (
    MarketProblem,
    SolverSettings,
    follower_kkt_residual,
    solve_equilibrium,
    solve_followers,
)


@pytest.fixture(scope="module")
def best_response():
    pop = mixed_population(200, 4, seed=11).on("cpu")
    prices = torch.tensor([0.9, 1.1, 0.7, 1.3], dtype=torch.float64)
    state = solve_followers(pop, prices)
    assert follower_kkt_residual(pop, state) <= 1e-8  # the reference point is a true best response
    return pop, state


def _at(state, demand: torch.Tensor):
    """The same prices and budget multipliers, another basket (the budget check unchanged)."""
    return dataclasses.replace(state, demand=demand)


def test_overbuying_is_far_from_a_best_response(best_response) -> None:
    # three times the best basket: the marginal utility falls below the price (a negative gap)
    pop, state = best_response
    assert follower_kkt_residual(pop, _at(state, state.demand * 3.0)) > 0.1


def test_underbuying_is_far_from_a_best_response(best_response) -> None:
    pop, state = best_response
    assert follower_kkt_residual(pop, _at(state, state.demand * 0.3)) > 0.1


def test_buying_nothing_where_it_pays_is_far_from_a_best_response(best_response) -> None:
    pop, state = best_response
    assert follower_kkt_residual(pop, _at(state, torch.zeros_like(state.demand))) > 0.1


def test_a_budget_overrun_is_in_the_residual(best_response) -> None:
    # stopped before any budget root: every tenant buys as if its budget were slack
    pop, state = best_response
    early = solve_followers(pop, state.prices, max_iterations=0)
    finite = torch.isfinite(pop.budget)
    overrun = float(((early.spend - pop.budget)[finite] / pop.budget[finite]).max())
    assert overrun > 0.1  # the instance has budget-bound tenants
    assert early.budget_residual == pytest.approx(overrun, rel=1e-12)
    assert follower_kkt_residual(pop, early) >= overrun


def test_a_budget_multiplier_on_a_slack_budget_is_in_the_residual(best_response) -> None:
    # a multiplier a > 1 claims the budget binds: with money left over, that is wrong
    pop, state = best_response
    high = solve_followers(pop, state.prices, state.scale * 4.0, max_iterations=0)
    finite = torch.isfinite(pop.budget)
    gap = ((high.scale - 1.0) * (pop.budget - high.spend).abs() / pop.budget)[finite]
    assert float(gap.max()) > 0.1 and bool((high.spend[finite] <= pop.budget[finite]).all())
    assert high.budget_residual == pytest.approx(float(gap.max()), rel=1e-12)


def _problem() -> MarketProblem:
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


def test_a_converged_leader_whose_followers_are_off_is_not_accepted(followers_off_by) -> None:
    problem, last = _problem(), np.array([2.0, 2.0])
    settings = SolverSettings()
    good = solve_equilibrium(problem, last_prices=last, max_step=0.25, settings=settings)
    assert good.status == "converged" and good.follower_kkt <= settings.tolerance
    followers_off_by(10 * settings.tolerance)  # ten times the tolerance: far below 100x
    report = solve_equilibrium(problem, last_prices=last, max_step=0.25, settings=settings)
    assert report.status == "fallback" and not report.converged
    assert "followers' KKT residual" in report.fallback_reason
    np.testing.assert_allclose(report.prices, last)  # the prices in force stay


def test_followers_within_tolerance_are_accepted(followers_off_by) -> None:
    settings = SolverSettings()
    followers_off_by(0.5 * settings.tolerance)
    report = solve_equilibrium(_problem(), last_prices=np.array([2.0, 2.0]), max_step=0.25, settings=settings)
    assert report.status == "converged" and report.follower_kkt <= settings.tolerance
