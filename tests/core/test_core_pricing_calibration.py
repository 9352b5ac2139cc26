"""The configured tenants are calibrated to the expected load at fixed reference prices."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config
from market_pipeline.market import demand_at, solve_equilibrium
from market_pipeline.pricing import MAX_DEMAND_SCALE, build_market_problem, reference_prices


@pytest.fixture(scope="module")
def config():
    return load_config(DEFAULT_CONFIG_PATH, environ={})


def _capacity(config, gpus=1000.0):
    return {pool.pool_id: gpus for pool in config.pools}


def _pool_demand(inputs, prices):
    demand = demand_at(inputs.problem, prices)
    out: dict[str, float] = {}
    for name, d in zip(inputs.problem.resource_names, demand):
        out[inputs.pool_of_resource[name]] = out.get(inputs.pool_of_resource[name], 0.0) + float(d)
    return out


def test_calibrated_population_buys_the_expected_load_at_reference_prices(config):
    base = build_market_problem(config, _capacity(config))
    names = base.problem.resource_names
    pools = [base.pool_of_resource[n] for n in names]
    classes = [base.class_of_resource[n] for n in names]
    reference = reference_prices(config, pools, classes)
    configured = _pool_demand(base, reference)
    target_pool = max(configured, key=configured.get)
    expected = {target_pool: 3.0 * configured[target_pool]}
    calibrated = build_market_problem(config, _capacity(config), expected)
    assert calibrated.demand_scale_by_pool[target_pool] == pytest.approx(3.0, rel=1e-9)
    assert all(k == 1.0 for p, k in calibrated.demand_scale_by_pool.items() if p != target_pool)
    # exact for tenants whose claims all sit in the scaled pool, close otherwise (shared budgets)
    assert _pool_demand(calibrated, reference)[target_pool] == pytest.approx(expected[target_pool], rel=0.15)


def test_more_expected_load_raises_the_equilibrium_price_once_capacity_binds(config):
    # log tenants scaled up buy proportionally more at any price, so a monopolist's price only
    # moves when capacity binds
    base = build_market_problem(config, _capacity(config))
    names = base.problem.resource_names
    reference = reference_prices(config, [base.pool_of_resource[n] for n in names],
                                 [base.class_of_resource[n] for n in names])
    configured = _pool_demand(base, reference)
    capacity = {p: 0.5 * d for p, d in configured.items()}  # binds at 2x load, not at 0.5x
    prices = []
    for factor in (0.5, 2.0):
        inputs = build_market_problem(config, capacity, {p: factor * d for p, d in configured.items()})
        report = solve_equilibrium(inputs.problem)
        assert report.status in ("converged", "capacity_infeasible")
        prices.append(report.prices)
    assert np.all(prices[1] >= prices[0] - 1e-9) and np.any(prices[1] > prices[0] * 1.01)


def test_calibration_is_bounded_and_ignores_unknown_pools(config):
    pool = config.pools[0].pool_id
    inputs = build_market_problem(config, _capacity(config), {pool: 1e9, "no-such-pool": 5.0})
    assert inputs.demand_scale_by_pool[pool] == MAX_DEMAND_SCALE
    assert "no-such-pool" not in inputs.demand_scale_by_pool
    idle = build_market_problem(config, _capacity(config), {pool: 0.0})
    assert idle.demand_scale_by_pool[pool] == pytest.approx(1.0 / MAX_DEMAND_SCALE)
