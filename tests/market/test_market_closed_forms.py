"""The solver against closed-form Stackelberg prices."""

from __future__ import annotations

import math

import numpy as np
import pytest
from market_test_helpers import resource, tenant

from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.solve import solve_equilibrium


def _linear_demand_problem(capacity, unit_cost=1.0):
    # quadratic tenants: d_j = s_j (1 - p / w_j), so D(p) = a - b p with a = sum s, b = sum s / w
    chokes, sats = [8.0, 9.0, 10.0, 12.0], [3.0, 1.0, 2.0, 4.0]
    tenants = [tenant(f"q{j}", [w], [s], utility="quadratic") for j, (w, s) in enumerate(zip(chokes, sats))]
    problem = MarketProblem.from_instance_json(
        {"resources": [resource("gpu", capacity, unit_cost, 0.1, 50.0)], "tenants": tenants}
    )
    a = sum(sats)
    b = sum(s / w for w, s in zip(chokes, sats))
    return problem, a, b


@pytest.mark.parametrize("start", [None, 0.2, 40.0])
def test_linear_demand_monopoly_price(start):
    problem, a, b = _linear_demand_problem(capacity=None, unit_cost=1.5)
    expected = (a / b + 1.5) / 2.0
    last = None if start is None else np.array([start])
    report = solve_equilibrium(problem, last_prices=last)
    assert report.converged and report.status == "converged"
    assert report.prices[0] == pytest.approx(expected, rel=1e-7)
    assert report.demand[0] == pytest.approx(a - b * expected, rel=1e-7)
    assert report.kkt_residual <= 1e-6


def test_binding_capacity_price_clears_the_market():
    problem, a, b = _linear_demand_problem(capacity=2.0, unit_cost=1.0)
    assert a - b * (a / b + 1.0) / 2.0 > 2.0  # the capacity binds at the unconstrained optimum
    report = solve_equilibrium(problem)
    assert report.converged
    assert report.prices[0] == pytest.approx((a - 2.0) / b, rel=1e-7)
    assert report.demand[0] == pytest.approx(2.0, rel=1e-8)
    assert report.demand[0] <= 2.0 * (1 + 1e-7)
    assert report.capacity_price[0] > 0  # the capacity constraint carries a shadow price


@pytest.mark.parametrize("w,s,c", [(10.0, 2.0, 1.0), (3.0, 0.5, 2.5)])
def test_identical_log_tenants_price(w, s, c):
    tenants = [tenant(f"t{j}", [w], [s]) for j in range(25)]
    problem = MarketProblem.from_instance_json(
        {"resources": [resource("gpu", None, c, 0.01, 1000.0)], "tenants": tenants}
    )
    report = solve_equilibrium(problem, last_prices=np.array([50.0]))
    assert report.converged
    assert report.prices[0] == pytest.approx(math.sqrt(w * c / s), rel=1e-7)
    assert report.follower_kkt <= 1e-6


def test_identical_log_tenants_independent_resources():
    # separable log utilities without budgets: each resource has its own closed form
    w, s, c = [6.0, 2.0], [1.0, 4.0], [1.0, 0.2]
    tenants = [tenant(f"t{j}", w, s) for j in range(10)]
    resources = [resource(f"r{i}", None, c[i], 0.01, 100.0) for i in range(2)]
    report = solve_equilibrium(MarketProblem.from_instance_json({"resources": resources, "tenants": tenants}))
    assert report.converged
    for i in range(2):
        assert report.prices[i] == pytest.approx(math.sqrt(w[i] * c[i] / s[i]), rel=1e-7)
