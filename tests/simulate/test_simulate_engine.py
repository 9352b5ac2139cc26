from __future__ import annotations

import numpy as np
import pytest
from simulate_testkit import inputs, run

from market_pipeline.lab.simulate.engine import StrategyRun
from market_pipeline.lab.simulate.jobs import DONE, QUEUED, RUNNING
from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID
from market_pipeline.lab.simulate.runner import make_strategy
from market_pipeline.lab.simulate.settings import EconomicAssumptions


def test_simulate_static_uncongested_serves_the_load_without_waiting():
    scenario = inputs(ratio=0.3, days=1.0, runtime_s=900.0)
    result = run(scenario, "static").metrics
    assert result["rigid_sla_violations"] == 0
    assert result["wait_p99_s"] == 0.0
    assert result["drains"] == 0
    utilisation = result["gpu_utilization"]
    assert 0.3 * 0.7 < utilisation < 0.3 * 1.3
    prices = {p.index: p.prices.list_price for p in scenario.pools}
    assert result["revenue"] > 0 and result["profit"] < result["revenue"]
    assert min(prices.values()) <= result["rigid_cost_per_gpu_hour"] <= max(prices.values())


def test_simulate_revenue_is_billed_gpu_hours_times_price():
    scenario = inputs(ratio=0.4, days=0.5)
    strategy_run = StrategyRun(scenario, make_strategy("static", scenario))
    result = strategy_run.run()
    meter = strategy_run.meter
    list_price = np.array([p.prices.list_price for p in scenario.pools])
    capacity = np.array([p.gpus for p in scenario.pools], dtype=float)
    tick_hours = scenario.settings.tick_seconds / 3600.0
    # static pricing posts each pool's list price to both classes; a job pays the price of the
    # pool it bought in, also where it spilled to run on another pool
    expected = float((meter.billed_by_pool.sum(axis=1) * list_price).sum())
    assert result.metrics["revenue"] == pytest.approx(expected, rel=1e-9)
    assert meter.billed_gpu_hours.sum() == pytest.approx(meter.allocated_gpu_hours.sum())  # no drains
    running = float((meter.utilization * capacity).sum() * tick_hours)  # counted where jobs run
    assert running == pytest.approx(meter.allocated_gpu_hours.sum(), rel=1e-9)
    # every job is accounted for
    jobs = strategy_run.jobs
    assert set(jobs.state) <= {QUEUED, RUNNING, DONE}
    for cluster in strategy_run.clusters:
        assert (cluster.cap.gpu_free >= 0).all() and (cluster.cap.cpu_free >= 0).all()
    assert (meter.utilization <= 1.0 + 1e-9).all()


def test_simulate_utilization_equals_static_below_the_threshold():
    scenario = inputs(ratio=0.25, days=0.5)
    static, dynamic = run(scenario, "static").metrics, run(scenario, "utilization").metrics
    assert static["revenue"] == pytest.approx(dynamic["revenue"])
    assert static["jobs_arrived"] == dynamic["jobs_arrived"]


def test_simulate_overload_makes_rigid_jobs_wait():
    scenario = inputs(ratio=1.6, days=0.5)
    result = run(scenario, "static").metrics
    assert result["rigid_sla_violations"] > 0
    assert result["wait_p99_s"] > scenario.sla_wait_s
    assert result["jobs_waiting_at_end"] > 0


def test_simulate_stackelberg_drains_within_the_limits():
    economics = EconomicAssumptions(tenants_per_class=3, elastic_elasticity=4.0)
    scenario = inputs(ratio=1.1, days=1.0, runtime_s=3600.0, economics=economics)
    strategy_run = StrategyRun(scenario, make_strategy("stackelberg", scenario))
    result = strategy_run.run()
    metrics = result.metrics
    assert metrics["drains"] > 0
    assert metrics["work_lost_gpu_hours"] > 0
    cap = scenario.config.guardrails.task_drain.tenant_max_drains_per_day
    per_tenant: dict[str, int] = {}
    for entry in strategy_run.drainer.ledger.entries:
        per_tenant[entry.tenant_id] = per_tenant.get(entry.tenant_id, 0) + 1
    assert max(per_tenant.values()) <= cap  # one simulated day: the daily cap holds
    assert all(t.startswith(("elastic", "latent")) for t in per_tenant)  # only drainable work
    assert result.extra["solves"]["fallback"] == 0


def test_simulate_stackelberg_prices_stay_in_bounds_and_band():
    scenario = inputs(ratio=0.7, days=0.5)
    result = run(scenario, "stackelberg")
    prices = result.series["prices"]
    for pool in scenario.pools:
        g, d = prices[:, 2 * pool.index], prices[:, 2 * pool.index + 1]
        assert (g >= pool.prices.price_min - 1e-9).all() and (g <= pool.prices.guaranteed_max + 1e-9).all()
        assert (d <= (1 - pool.prices.discount_min) * g + 1e-9).all()
        assert (d >= (1 - pool.prices.discount_max) * g - 1e-9).all()
    assert (
        result.metrics["elastic_cost_per_gpu_hour"]
        < run(scenario, "static").metrics["elastic_cost_per_gpu_hour"]
    )


def test_simulate_classes_are_billed_separately():
    scenario = inputs(ratio=0.5, days=0.5)
    series = run(scenario, "static").series["allocated_by_class"]
    assert series[:, RIGID].mean() > 0 and series[:, ELASTIC].mean() > 0
    assert np.isfinite(series).all()
