"""Follower best responses: exact KKT, agreement with an independent solver, behaviour."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from market_test_helpers import assert_close, mixed_population
from scipy.optimize import minimize

from market_pipeline.market.followers import follower_kkt_residual, solve_followers
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.utility import utility


@pytest.fixture(autouse=True)
def one_thread():
    # as solve_equilibrium does: tiny kernels only pay synchronisation for more threads
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _prices(m: int, seed: int) -> torch.Tensor:
    return torch.tensor(np.random.default_rng(seed).uniform(0.5, 1.5, m), dtype=torch.float64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_response_satisfies_kkt(seed):
    pop = mixed_population(300, 6, seed).on("cpu")
    state = solve_followers(pop, _prices(6, seed))
    assert follower_kkt_residual(pop, state) <= 1e-8
    bound = state.budget_bound
    assert 0 < int(bound.sum()) < pop.size  # the instance exercises both regimes
    assert torch.allclose(state.spend[bound], pop.budget[bound], rtol=1e-8)
    assert bool((state.spend[~bound] <= pop.budget[~bound] * (1 + 1e-12)).all())
    assert bool((state.demand >= 0).all())


def _tenant_utility(pop, block, row, d):
    with torch.no_grad():
        dd = torch.zeros_like(block.weight[:1])
        dd[0] = torch.as_tensor(d)
        sub = type(block)(
            block.family,
            0,
            1,
            block.weight[row : row + 1],
            block.saturation[row : row + 1],
            block.neg_saturation[row : row + 1],
            block.choke[row : row + 1],
            None if block.eta is None else block.eta[row : row + 1],
            None if block.slope is None else block.slope[row : row + 1],
            None if block.neg_slope is None else block.neg_slope[row : row + 1],
        )
        return float(utility(sub, dd))


def test_best_response_matches_an_independent_nlp_solver():
    population = mixed_population(24, 4, seed=5)
    pop = population.on("cpu")
    p = _prices(4, 5)
    state = solve_followers(pop, p)
    delay = population.delay_cost.numpy()
    for block in pop.blocks:
        for row in range(0, block.stop - block.start, 3):
            j = block.start + row
            price, budget = p.numpy(), float(pop.budget[j])

            def negative_surplus(d, row=row, block=block, j=j):
                return -(_tenant_utility(pop, block, row, d) - (price + delay[j]) @ d)

            result = minimize(
                negative_surplus,
                np.full(4, 0.1),
                method="SLSQP",
                bounds=[(0, None)] * 4,
                constraints=[{"type": "ineq", "fun": lambda d: budget - price @ d}],
                options={"ftol": 1e-14, "maxiter": 500},
            )
            ours = state.demand[j].numpy()
            assert -negative_surplus(ours) >= -result.fun - 1e-7  # at least as good as SLSQP
            np.testing.assert_allclose(ours, result.x, atol=2e-4)


def test_warm_start_reaches_the_same_response_faster():
    pop = mixed_population(400, 5, seed=3).on("cpu")
    p = _prices(5, 3)
    cold = solve_followers(pop, p)
    warm = solve_followers(pop, p * 1.001, cold.scale)
    reference = solve_followers(pop, p * 1.001)
    assert warm.iterations < reference.iterations
    assert_close(warm.demand, reference.demand, rtol=1e-8, atol=1e-10)


def test_drain_intolerant_tenants_never_buy_the_drainable_class():
    drainable = np.array([False, True, False, True])
    population = mixed_population(60, 4, seed=4, drainable_mask=drainable)
    intolerant = TenantPopulation.build(
        ids=list(population.ids),
        families=list(population.families),
        weight=population.weight,
        saturation=population.saturation,
        budget=population.budget,
        drainable_mask=drainable,
        eta=population.eta,
        drain_tolerant=np.arange(60) % 2 == 0,
    )
    state = solve_followers(intolerant.on("cpu"), _prices(4, 4) * 0.3)
    rigid = ~intolerant.drain_tolerant
    assert float(state.demand[rigid][:, drainable].abs().max()) == 0.0
    assert float(state.demand[~rigid][:, drainable].sum()) > 0.0


def test_budget_bound_log_tenants_substitute_across_gpu_models():
    # one tenant valuing two GPU models, budget-bound: a dearer H100 shifts spend to the A100
    pop = TenantPopulation.build(
        ids=["j"],
        families=["log"],
        weight=[[4.0, 3.0]],
        saturation=[[1.0, 1.0]],
        budget=[2.0],
        drainable_mask=np.zeros(2, dtype=bool),
    ).on("cpu")
    low = solve_followers(pop, torch.tensor([1.0, 1.0], dtype=torch.float64))
    high = solve_followers(pop, torch.tensor([1.2, 1.0], dtype=torch.float64))
    assert bool(low.budget_bound[0])
    assert float(high.demand[0, 0]) < float(low.demand[0, 0])
    assert float(high.demand[0, 1]) > float(low.demand[0, 1])


# The residual away from the best response: every kind of wrong basket is far from zero.
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


# The residual's value at a known wrong point, worked out by hand: two log tenants
# (U'(d) = w / (s + d)) with slack budgets, prices (2, 1). A's best basket is (1, 2); B's is
# nothing (U'(0) = (1, 0.5) is below both prices, and buying nothing there is right).
@pytest.fixture(scope="module")
def two_log_tenants():
    pop = TenantPopulation.build(
        ids=["a", "b"],
        families=["log", "log"],
        weight=[[4.0, 3.0], [1.0, 0.5]],
        saturation=[[1.0, 1.0], [1.0, 1.0]],
        budget=[float("inf"), float("inf")],
        drainable_mask=np.zeros(2, dtype=bool),
    ).on("cpu")
    state = solve_followers(pop, torch.tensor([2.0, 1.0], dtype=torch.float64))
    assert torch.allclose(state.demand, torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64))
    assert follower_kkt_residual(pop, state) <= 1e-12
    return pop, state


@pytest.mark.parametrize(
    ("basket_a", "residual"),
    [
        # three GPUs of the first kind: U' = 4/4 = 1 against the price 2, a gap of -1,
        # relative to the price 0.5 (an overbuy counts with its sign turned)
        ((3.0, 2.0), 0.5),
        # none of the first kind where the first unit is worth 4 at price 2: 2 / 2 = 1
        ((0.0, 2.0), 1.0),
        # half the second kind: U' = 3/2 = 1.5 against 1, relative 0.5; and both off: the worst
        ((1.0, 1.0), 0.5),
        ((3.0, 1.0), 0.5),
        ((1.0, 5.0), 0.5),  # U' = 3/6 = 0.5 against 1: -0.5
    ],
)
def test_the_residual_at_a_wrong_basket_is_its_worst_relative_gap(
    two_log_tenants, basket_a, residual
) -> None:
    pop, state = two_log_tenants
    demand = torch.tensor([basket_a, [0.0, 0.0]], dtype=torch.float64)
    assert follower_kkt_residual(pop, _at(state, demand)) == pytest.approx(residual, rel=1e-12)


def test_buying_nothing_where_nothing_pays_has_no_residual(two_log_tenants) -> None:
    """B buys nothing at prices above its first unit's worth: that is its best response,
    however far below the price that worth is (only a wrong sign would count it)."""
    pop, state = two_log_tenants
    demand = torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    assert follower_kkt_residual(pop, _at(state, demand)) <= 1e-12
    # and B buying where it does not pay is counted: U'(1) = 0.5 against 2, 0.75 relative
    demand = torch.tensor([[1.0, 2.0], [1.0, 0.0]], dtype=torch.float64)
    assert follower_kkt_residual(pop, _at(state, demand)) == pytest.approx(0.75, rel=1e-12)
