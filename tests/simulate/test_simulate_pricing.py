from __future__ import annotations

import math

import numpy as np
import pytest
from simulate_testkit import inputs

from market_pipeline.lab.simulate.pricing import MarketView, StaticPricing, UtilizationPricing
from market_pipeline.lab.simulate.settings import EconomicAssumptions
from market_pipeline.lab.simulate.stackelberg import StackelbergPricing


def _view(scenario, demand_share: float, pending_rigid: float = 0.0) -> MarketView:
    capacity = np.array([p.gpus for p in scenario.pools], dtype=float)
    allocated = np.stack([capacity * demand_share * 0.7, capacity * demand_share * 0.3], axis=1)
    pending = np.zeros_like(allocated)
    pending[:, 0] = pending_rigid
    last = np.repeat([p.prices.list_price for p in scenario.pools], 2)
    return MarketView(0, 0.0, capacity, allocated, pending, np.ones(48), last)


def test_simulate_utilization_price_is_flat_then_exponential_then_capped():
    scenario = inputs(economics=EconomicAssumptions(guaranteed_cap=3.0, tenants_per_class=2))
    strategy = UtilizationPricing(scenario.pools, scenario.settings.economics)
    p0 = np.repeat([p.prices.list_price for p in scenario.pools], 2)
    np.testing.assert_allclose(strategy.decide(_view(scenario, 0.80)).prices, p0)
    np.testing.assert_allclose(strategy.decide(_view(scenario, 1.00)).prices, 2.0 * p0)
    at_92 = strategy.decide(_view(scenario, 0.92)).prices
    np.testing.assert_allclose(at_92, p0 * math.exp(math.log(2) * 0.07 / 0.15))
    capped = strategy.decide(_view(scenario, 1.5)).prices
    np.testing.assert_allclose(capped, 3.0 * p0)


def test_simulate_static_price_is_the_list_price():
    scenario = inputs()
    prices = StaticPricing(scenario.pools).decide(_view(scenario, 1.2)).prices
    np.testing.assert_allclose(prices, np.repeat([p.prices.list_price for p in scenario.pools], 2))


def test_simulate_stackelberg_tick_converges_and_respects_step_and_band():
    scenario = inputs()
    strategy = StackelbergPricing(scenario.model, scenario.pools, scenario.config, scenario.settings)
    view = _view(scenario, 0.5)
    decision = strategy.decide(view)
    step = scenario.config.market.max_price_step
    assert decision.info["status"] in ("converged", "capacity_infeasible")
    assert np.all(decision.prices <= view.last_prices * (1 + step) + 1e-9)
    assert np.all(decision.prices >= view.last_prices * (1 - step) - 1e-9)
    g, d = decision.prices[0::2], decision.prices[1::2]
    assert np.all(d < g)


def test_simulate_backlog_shield_raises_the_price_of_a_backlogged_pool():
    scenario = inputs(economics=EconomicAssumptions(guaranteed_cap=3.0, tenants_per_class=2))
    strategy = StackelbergPricing(scenario.model, scenario.pools, scenario.config, scenario.settings)
    calm = strategy.decide(_view(scenario, 0.5)).prices
    strategy = StackelbergPricing(scenario.model, scenario.pools, scenario.config, scenario.settings)
    capacity = np.array([p.gpus for p in scenario.pools], dtype=float)
    view = _view(scenario, 1.0, pending_rigid=capacity.max())
    crowded = strategy.decide(view)
    assert crowded.info["shield"], "a pool with a large backlog must be shielded"
    assert crowded.prices[0] >= calm[0] - 1e-9 and crowded.prices[2] >= calm[2] - 1e-9
    # the shield raises inside the promises: never past the max step from the price in force
    assert np.all(crowded.prices <= view.last_prices * (1 + scenario.config.market.max_price_step) + 1e-9)
    summary = strategy.summary()
    assert summary["shielded_ticks"] + summary["undrainable_pool_ticks"] >= 1


@pytest.mark.parametrize(
    "bad", [{"elastic_elasticity": 0.0}, {"budget_headroom": 0.0}, {"guaranteed_cap": 0.9}]
)
def test_simulate_economics_validate(bad):
    from market_pipeline.lab.simulate.errors import SimulationInputError

    with pytest.raises(SimulationInputError, match=next(iter(bad))):
        EconomicAssumptions(**bad)


def test_simulate_drainable_capacity_leaves_the_expected_guaranteed_claim():
    """The simulator's leader sells drainable work what the guaranteed class's claim leaves of
    the pool (`tick.pricing.drainable_capacity`, the live tick's rule): the rigid GPUs held and
    waiting now, and with `drainable_leaves_expected_claim`, after a lull, those the tenants
    are expected to hold."""
    scenario = inputs()
    strategy = StackelbergPricing(scenario.model, scenario.pools, scenario.config, scenario.settings)
    view = _view(scenario, 0.2)
    usable = strategy.efficiency * view.capacity
    rigid_now = view.allocated[:, 0] + view.pending[:, 0]
    lull = strategy._capacities(view, np.zeros_like(usable))
    np.testing.assert_allclose(lull[0::2], usable)
    np.testing.assert_allclose(lull[1::2], usable - rigid_now)
    expected = rigid_now + 0.25 * usable
    ahead = strategy._capacities(view, expected)
    np.testing.assert_allclose(ahead[1::2], usable - expected)
    decision = strategy.decide(view)  # and the tick runs on it
    assert decision.info["status"] in ("converged", "capacity_infeasible")
    # with `drainable_leaves_expected_claim` the tick hands `_capacities` the guaranteed demand
    # expected at the prices in force; off (the default), none: the claim now alone
    rigid = scenario.config.guardrails.rigid_guarantee.model_copy(
        update={"drainable_leaves_expected_claim": True}
    )
    guardrails = scenario.config.guardrails.model_copy(update={"rigid_guarantee": rigid})
    on_config = scenario.config.model_copy(update={"guardrails": guardrails})
    seen = {}
    for label, config in (("on", on_config), ("off", scenario.config)):
        s = StackelbergPricing(scenario.model, scenario.pools, config, scenario.settings)
        real = s._capacities

        def spy(v, expected, real=real, label=label):
            seen[label] = np.asarray(expected).copy()
            return real(v, expected)

        s._capacities = spy
        s.decide(view)
    assert np.all(seen["on"] > 0)
    np.testing.assert_allclose(seen["off"], 0.0)
