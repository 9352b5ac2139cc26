"""The configured tenants are calibrated to the expected load at fixed reference prices, by
scaling how much they value GPU time (not their size), so the price follows the load."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config
from market_pipeline.market.solve import demand_at, solve_equilibrium
from market_pipeline.tick.pricing import MAX_VALUE_SCALE, build_market_problem, reference_prices


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
    assert calibrated.demand_scale_by_pool[target_pool] > 1.0
    assert all(k == 1.0 for p, k in calibrated.demand_scale_by_pool.items() if p != target_pool)
    # the bisection meets the target within its tolerance (budgets couple pools only weakly)
    assert _pool_demand(calibrated, reference)[target_pool] == pytest.approx(expected[target_pool], rel=1e-3)


def test_more_expected_load_raises_the_equilibrium_price_with_capacity_to_spare(config):
    # the load scales the tenants' valuation at a fixed size: a busier hour is less elastic,
    # so the leader's price rises with it although capacity never binds
    base = build_market_problem(config, _capacity(config))
    names = base.problem.resource_names
    reference = reference_prices(
        config, [base.pool_of_resource[n] for n in names], [base.class_of_resource[n] for n in names]
    )
    configured = _pool_demand(base, reference)
    prices = []
    for factor in (0.5, 2.0):
        inputs = build_market_problem(
            config, _capacity(config), {p: factor * d for p, d in configured.items()}
        )
        report = solve_equilibrium(inputs.problem)
        assert report.status == "converged"
        assert not report.oversold
        prices.append(report.prices)
    guaranteed = [i for i, n in enumerate(names) if base.class_of_resource[n] == "guaranteed"]
    assert np.all(prices[1][guaranteed] > prices[0][guaranteed] * 1.05)


def test_calibration_is_bounded_and_ignores_unknown_pools(config):
    pool = config.pools[0].pool_id
    inputs = build_market_problem(config, _capacity(config), {pool: 1e9, "no-such-pool": 5.0})
    assert inputs.demand_scale_by_pool[pool] == pytest.approx(MAX_VALUE_SCALE, rel=1e-6)
    assert "no-such-pool" not in inputs.demand_scale_by_pool
    idle = build_market_problem(config, _capacity(config), {pool: 0.0})
    assert idle.demand_scale_by_pool[pool] < 1.0
    names = idle.problem.resource_names
    reference = reference_prices(
        config, [idle.pool_of_resource[n] for n in names], [idle.class_of_resource[n] for n in names]
    )
    assert _pool_demand(idle, reference)[pool] == pytest.approx(0.0, abs=1e-3)


def test_at_a_pools_typical_load_the_list_price_is_the_equilibrium(config):
    """Sized to the typical load with elasticity 2 at list, and with a GPU-hour costing half
    its list price, the leader's best price for a typical hour is the list price; half the
    load prices below it, more above it."""
    typical = {p.pool_id: 20.0 for p in config.pools}
    prices = {}
    for factor in (0.5, 1.0, 1.5):
        inputs = build_market_problem(
            config, _capacity(config), {p: factor * t for p, t in typical.items()}, typical
        )
        report = solve_equilibrium(inputs.problem)
        assert report.converged
        prices[factor] = report.prices
    names = inputs.problem.resource_names
    listed = np.array([config.pool_by_id[inputs.pool_of_resource[n]].base_price for n in names])
    guaranteed = np.array([inputs.class_of_resource[n] == "guaranteed" for n in names])
    assert np.allclose(prices[1.0][guaranteed] / listed[guaranteed], 1.0, atol=0.05)
    assert np.all(prices[0.5][guaranteed] < 0.95 * listed[guaranteed])
    assert np.all(prices[1.5][guaranteed] > 1.05 * listed[guaranteed])


def test_drainable_capacity_leaves_the_guaranteed_claim_now_or_expected():
    """Drainable work is sold against the pool less the guaranteed class's claim: the more of
    what it holds and waits for now and what it is expected to hold, the expectation at most
    the pool, never under the floor share."""
    from market_pipeline.tick.pricing import DRAINABLE_CAPACITY_FLOOR, drainable_capacity

    usable = np.array([100.0, 100.0, 100.0, 100.0])
    now = np.array([30.0, 30.0, 0.0, 120.0])
    expected = np.array([10.0, 60.0, 500.0, 0.0])
    out = drainable_capacity(usable, now, expected)
    np.testing.assert_allclose(out[:2], [70.0, 40.0])  # now binds, then the expectation
    assert out[2] == pytest.approx(DRAINABLE_CAPACITY_FLOOR * 100.0)  # expected above the pool
    assert out[3] == pytest.approx(DRAINABLE_CAPACITY_FLOOR * 100.0)  # overloaded now


def _expected_claim(config, on: bool):
    rigid = config.guardrails.rigid_guarantee.model_copy(update={"drainable_leaves_expected_claim": on})
    return config.model_copy(
        update={"guardrails": config.guardrails.model_copy(update={"rigid_guarantee": rigid})}
    )


def test_live_problem_sells_drainable_work_what_the_guaranteed_claim_leaves(config):
    """A pool with a reported guaranteed claim sells its drainable class what the claim now
    leaves (the simulator's rule); pools without a report keep the whole pool for both
    classes. With `drainable_leaves_expected_claim` the claim is at least the guaranteed
    demand expected at the prices in force."""
    assert not config.guardrails.rigid_guarantee.drainable_leaves_expected_claim  # the default
    typical = {p.pool_id: 400.0 for p in config.pools}
    plain = build_market_problem(config, _capacity(config), typical, typical)
    first, second = config.pools[0].pool_id, config.pools[1].pool_id
    names = plain.problem.resource_names
    g, d = f"{first}/guaranteed", f"{first}/drainable"
    base = dict(zip(names, plain.problem.resources.capacity))
    now_only = build_market_problem(config, _capacity(config), typical, typical, {first: 50.0})
    now_cap = dict(zip(names, now_only.problem.resources.capacity))
    assert now_cap[g] == base[g] == 1000.0 and now_cap[d] == pytest.approx(950.0)
    assert now_cap[f"{second}/drainable"] == base[f"{second}/drainable"] == 1000.0
    sold = now_only.drainable_capacity_by_pool()  # what the asset's metadata shows per pool
    assert sold[first] == pytest.approx(950.0) and sold[second] == 1000.0

    on = _expected_claim(config, True)
    claimed = build_market_problem(on, _capacity(on), typical, typical, {first: 50.0})
    cap = dict(zip(names, claimed.problem.resources.capacity))
    reference = reference_prices(
        config, [plain.pool_of_resource[n] for n in names], [plain.class_of_resource[n] for n in names]
    )
    expected = dict(zip(names, demand_at(plain.problem, reference)))
    assert expected[g] > 50.0  # the expectation is the larger claim here
    assert cap[d] == pytest.approx(1000.0 - expected[g])
    assert cap[f"{second}/drainable"] == 1000.0
    # a claim now above the expectation binds instead
    heavy = build_market_problem(on, _capacity(on), typical, typical, {first: 900.0})
    assert dict(zip(names, heavy.problem.resources.capacity))[d] == pytest.approx(100.0)
    # the prices in force set the expectation: a dearer guaranteed class is expected to hold less
    dear = build_market_problem(
        on, _capacity(on), typical, typical, {first: 0.0}, {g: 2.0 * float(reference[names.index(g)])}
    )
    assert dict(zip(names, dear.problem.resources.capacity))[d] > cap[d]
