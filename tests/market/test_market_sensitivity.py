"""The implicit derivatives against finite differences of the exact best response."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from market_test_helpers import mixed_population

from market_pipeline.market.followers import solve_followers
from market_pipeline.market.sensitivity import demand_derivatives


@pytest.fixture(autouse=True)
def one_thread():
    # as solve_equilibrium does: tiny kernels only pay synchronisation for more threads
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


STEP = 1e-6


def _setup(seed, multiplicity):
    pop = mixed_population(80, 5, seed, multiplicity=multiplicity).on("cpu")
    rng = np.random.default_rng(seed + 100)
    p = torch.tensor(rng.uniform(0.5, 1.5, 5), dtype=torch.float64)
    cost = torch.tensor(rng.uniform(0.1, 0.4, 5), dtype=torch.float64)
    mu = torch.tensor(rng.uniform(0.0, 0.3, 5), dtype=torch.float64)
    return pop, p, cost, mu


def _aggregate(pop, p):
    return pop.aggregate(solve_followers(pop, p, tol=1e-14).demand)


def _central(f, p):
    eye = torch.eye(p.shape[0], dtype=torch.float64)
    return torch.stack([(f(p + STEP * e) - f(p - STEP * e)) / (2 * STEP) for e in eye], dim=-1)


@pytest.mark.parametrize("seed,multiplicity", [(0, False), (1, True), (2, False)])
def test_jacobian_gradient_and_hessian_match_finite_differences(seed, multiplicity):
    pop, p, cost, mu = _setup(seed, multiplicity)
    state = solve_followers(pop, p, tol=1e-14)
    assert 0 < int(state.budget_bound.sum()) < pop.size
    der = demand_derivatives(pop, state, cost, mu)
    jac_fd = _central(lambda q: _aggregate(pop, q), p)
    scale = float(jac_fd.abs().max())
    assert float((der.jacobian - jac_fd).abs().max()) <= 1e-6 * scale

    def profit(q):
        return ((q - cost) @ _aggregate(pop, q)).reshape(1)

    grad_fd = _central(profit, p)[0]
    assert float((der.profit_gradient - grad_fd).abs().max()) <= 1e-6 * float(grad_fd.abs().max())

    def lagrangian_gradient(q):
        s = solve_followers(pop, q, tol=1e-14)
        d = demand_derivatives(pop, s, cost, mu, with_hessian=False)
        return d.demand + d.jacobian.T @ (q - cost - mu)

    hess_fd = _central(lagrangian_gradient, p)
    assert float((der.lagrangian_hessian - hess_fd).abs().max()) <= 1e-5 * float(hess_fd.abs().max())


def test_multiplier_gradient_predicts_the_new_multiplier():
    pop, p, _, _ = _setup(3, False)
    state = solve_followers(pop, p, tol=1e-14)
    der = demand_derivatives(pop, state, torch.zeros(5, dtype=torch.float64), with_hessian=False)
    move = torch.full((5,), 1e-4, dtype=torch.float64)
    after = solve_followers(pop, p + move, tol=1e-14)
    predicted = state.scale + der.multiplier_gradient @ move
    stable = state.budget_bound & after.budget_bound
    assert float((predicted - after.scale)[stable].abs().max()) <= 1e-6
    assert float((state.scale - after.scale)[stable].abs().max()) > 1e-6  # the prediction is not trivial
