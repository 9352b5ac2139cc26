"""The economic mechanisms the seed relies on, as behaviour: the guaranteed price cap, time
shifting of priced-out elastic work, and the cost split of a fixed, powered fleet."""

from __future__ import annotations

import numpy as np
import pytest
from simulate_testkit import inputs

from market_pipeline.lab.simulate.arrivals import Candidates
from market_pipeline.lab.simulate.deferral import DeferredDemand
from market_pipeline.lab.simulate.engine import StrategyRun
from market_pipeline.lab.simulate.pricing import MarketView, PriceDecision, UtilizationPricing
from market_pipeline.lab.simulate.runner import make_strategy
from market_pipeline.lab.simulate.settings import EconomicAssumptions
from market_pipeline.lab.simulate.tenants import list_price_vector, resource_set


class Alternating:
    """Test strategy: the list price on even ticks, `high` x list on odd ticks (both classes)."""

    name = "alternating"
    drains = False

    def __init__(self, pools, high: float) -> None:
        self.list = list_price_vector(pools)
        self.high = high

    def decide(self, view: MarketView) -> PriceDecision:
        return PriceDecision(self.list * (self.high if view.tick % 2 else 1.0))


def _alternating(patience_hours: float, high: float = 1.6):
    scenario = inputs(
        days=1.0,
        ratio=0.4,
        runtime_s=900.0,
        economics=EconomicAssumptions(tenants_per_class=4, elastic_patience_hours=patience_hours),
    )
    strategy_run = StrategyRun(scenario, Alternating(scenario.pools, high))
    return strategy_run, strategy_run.run()


def test_deferred_elastic_work_is_served_at_the_next_cheaper_tick():
    run, result = _alternating(patience_hours=24.0)
    extra = result.extra
    assert extra["elastic_deferred_served"] > 50
    # work turned away at an expensive (odd) tick buys at the next even tick: ~1 tick later
    assert 0.0 < extra["elastic_deferral_p50_h"] <= 1.0 + 1e-9
    # deferred jobs are submitted at tick starts of cheap ticks only
    late = [
        j for j in range(len(run.jobs)) if run.jobs.arrival[j] > 0 and run.jobs.arrival[j] % 3600.0 == 0.0
    ]
    assert late and all(int(run.jobs.arrival[j] // 3600.0) % 2 == 0 for j in late)
    _, lost = _alternating(patience_hours=0.0)
    assert lost.extra["elastic_deferred_served"] == 0
    assert result.metrics["elastic_gpu_hours"] > lost.metrics["elastic_gpu_hours"]
    assert result.metrics["rigid_gpu_hours"] == pytest.approx(lost.metrics["rigid_gpu_hours"], rel=0.05)


def test_static_price_never_serves_deferred_work():
    scenario = inputs(days=1.0, ratio=0.4, runtime_s=900.0)
    result = StrategyRun(scenario, make_strategy("static", scenario)).run()
    assert result.extra["elastic_deferred"] > 0 and result.extra["elastic_deferred_served"] == 0


def test_deferred_work_expires_after_its_patience():
    backlog = DeferredDemand(np.array([True, False]), patience_s=3600.0)
    one = np.array([0, 1])
    backlog.add(
        Candidates(np.array([10.0, 20.0]), one, np.zeros(2, dtype=np.int64), one, np.array([0.5, 0.5]))
    )
    assert backlog.size == 1  # the rigid candidate is lost at once
    none = backlog.release(np.full((2, 1), 0.4), 1800.0)  # ratio 0.4 <= u: not yet
    assert none.size == 0 and backlog.size == 1
    gone = backlog.release(np.full((2, 1), 0.9), 3611.0)  # cheap enough, but waited too long
    assert gone.size == 0 and backlog.expired == 1 and backlog.size == 0


@pytest.mark.parametrize("strategy", ["utilization", "stackelberg"])
def test_guaranteed_price_never_exceeds_the_cap(strategy):
    # congested: demand at the list price is 1.3 x capacity, so both strategies want more
    scenario = inputs(
        days=1.0,
        ratio=1.3,
        runtime_s=1800.0,
        economics=EconomicAssumptions(tenants_per_class=4, guaranteed_cap=1.05),
    )
    run = StrategyRun(scenario, make_strategy(strategy, scenario))
    result = run.run()
    list_price = np.array([p.prices.list_price for p in scenario.pools])
    guaranteed = run.meter.prices[:, 0::2] / list_price
    assert guaranteed.max() <= 1.05 + 1e-9
    assert guaranteed.max() > 1.0  # the cap binds rather than nothing happening
    assert result.metrics["rigid_cost_per_gpu_hour"] <= 1.05 * list_price.max() + 1e-9


def test_solver_guaranteed_price_max_is_the_cap():
    scenario = inputs(economics=EconomicAssumptions(tenants_per_class=2, guaranteed_cap=1.05))
    resources = resource_set(scenario.pools)
    list_price = list_price_vector(scenario.pools)
    np.testing.assert_allclose(resources.price_max[0::2], 1.05 * list_price[0::2])
    assert np.all(resources.price_max[1::2] <= 0.8 * 1.05 * list_price[1::2] + 1e-12)  # band: >= 20% off
    util = UtilizationPricing(scenario.pools, scenario.settings.economics)
    np.testing.assert_allclose(util.high, 1.05 * list_price[0::2])


def test_fixed_fleet_cost_is_charged_on_idle_capacity():
    full = inputs(
        days=0.5, ratio=0.3, economics=EconomicAssumptions(tenants_per_class=2, avoidable_cost_share=1.0)
    )
    split = inputs(
        days=0.5, ratio=0.3, economics=EconomicAssumptions(tenants_per_class=2, avoidable_cost_share=0.1)
    )
    a = StrategyRun(full, make_strategy("static", full)).run().metrics
    b = StrategyRun(split, make_strategy("static", split)).run().metrics
    assert a["revenue"] == pytest.approx(b["revenue"])  # same run, only the cost differs
    unit = np.array([p.prices.unit_cost for p in full.pools])
    capacity_cost = float((np.array([p.gpus for p in full.pools]) * unit).sum()) * 12.0
    assert b["cost"] == pytest.approx(0.1 * a["cost"] + 0.9 * capacity_cost, rel=1e-9)
    assert b["cost"] > a["cost"]  # at 30% utilisation the idle GPUs dominate
    assert resource_set(split.pools).unit_cost[0] == pytest.approx(0.1 * unit[0])
