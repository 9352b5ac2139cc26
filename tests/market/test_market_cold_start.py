"""The cold start: a grid search on the uncoupled (slack-budget) monopoly problem."""

from __future__ import annotations

import math

import numpy as np
import pytest
from market_test_helpers import resource, tenant

from market_pipeline.lab.market.baseline import solve_baseline
from market_pipeline.lab.market.generate import random_problem
from market_pipeline.market.cold_start import GRID_POINTS, identical_tenant_prices, initial_prices
from market_pipeline.market.problem import MarketProblem


def test_grid_start_lands_within_a_cell_of_the_separable_optimum():
    w, s, c = [6.0, 2.0, 9.0], [1.0, 4.0, 0.5], [1.0, 0.2, 3.0]
    tenants = [tenant(f"t{j}", w, s) for j in range(10)]
    resources = [resource(f"r{i}", None, c[i], 0.01, 100.0) for i in range(3)]
    problem = MarketProblem.from_instance_json({"resources": resources, "tenants": tenants})
    start = initial_prices(problem)
    exact = np.sqrt(np.array(w) * np.array(c) / np.array(s))
    # two rounds of a log grid over [0.01, w/s]: the second cell is at most (range^(1/15))^(2/15) wide
    assert np.all(np.abs(np.log(start / exact)) <= math.log(10_000) / (GRID_POINTS - 1) ** 2)


def test_grid_start_respects_capacity_and_bounds():
    # linear demand D = 4 - p (one quadratic tenant); capacity 1 makes the best uncoupled price 3
    problem = MarketProblem.from_instance_json(
        {
            "resources": [resource("gpu", 1.0, 0.5, 0.2, 3.5)],
            "tenants": [tenant("q", [4.0], [4.0], utility="quadratic")],
        }
    )
    start = initial_prices(problem)
    assert 0.2 <= start[0] <= 3.5
    assert start[0] == pytest.approx(3.0, rel=0.05)


def test_resource_nobody_wants_starts_at_its_floor():
    problem = MarketProblem.from_instance_json(
        {
            "resources": [resource("a", None, 1.0, 0.3, 10.0), resource("b", None, 1.0, 0.7, 10.0)],
            "tenants": [tenant("t", [5.0, 0.0], [1.0, 1.0])],
        }
    )
    assert initial_prices(problem)[1] == pytest.approx(0.7)


def test_grid_start_is_closer_than_the_identical_tenant_formula_on_mixed_instances():
    from market_pipeline.market.solve import solve_equilibrium

    closer = 0
    for seed in range(5):
        problem = random_problem(200, 8, seed)
        optimum = solve_equilibrium(problem).prices
        grid_error = np.abs(np.log(initial_prices(problem) / optimum)).mean()
        formula_error = np.abs(np.log(identical_tenant_prices(problem) / optimum)).mean()
        closer += grid_error < formula_error
    assert closer == 5


def test_baseline_rejects_an_unknown_start():
    with pytest.raises(ValueError, match="baseline start"):
        solve_baseline(random_problem(5, 2, 0), start="random")
