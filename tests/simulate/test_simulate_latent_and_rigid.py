"""Latent elastic demand, the opening state, the warm-up, rigid spill and held drain room."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from simulate_testkit import FLEET, config, inputs, with_guarantee

from market_pipeline.lab.simulate.arrivals import initial_population
from market_pipeline.lab.simulate.cluster import PoolCluster
from market_pipeline.lab.simulate.engine import StrategyRun
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.jobs import QUEUED, RUNNING
from market_pipeline.lab.simulate.metrics import Meter
from market_pipeline.lab.simulate.opening import opening_jobs, opening_prices
from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID, MarketView, PriceDecision, StaticPricing
from market_pipeline.lab.simulate.report import rigid_price_index, target_checks
from market_pipeline.lab.simulate.runner import make_strategy
from market_pipeline.lab.simulate.settings import EconomicAssumptions, pool_prices
from market_pipeline.lab.simulate.synthetic import synthetic_fleet, synthetic_pods
from market_pipeline.lab.simulate.tenants import best_response, build_pools, calibrate, list_price_vector


def _model(ratio: float):
    nodes = synthetic_fleet(FLEET)
    economics = EconomicAssumptions(tenants_per_class=4, latent_elastic_ratio=ratio)
    pools = build_pools(nodes, pool_prices(nodes.model_names(), config(), economics))
    return calibrate(synthetic_pods(500, seed=3), nodes, pools, 40.0, economics), pools


def test_latent_twins_buy_nothing_at_list_and_the_ratio_at_half_price():
    model, pools = _model(1.5)
    latent = model.latent_mask
    assert latent.sum() == model.elastic[~latent].sum() == 4  # one twin per elastic tenant
    at_list = best_response(model, list_price_vector(pools))
    np.testing.assert_allclose(at_list[latent], 0.0, atol=1e-9)  # static still sees only the trace
    np.testing.assert_allclose(at_list[~latent], model.base_demand[~latent], rtol=1e-7, atol=1e-9)
    at_half = best_response(model, 0.5 * list_price_vector(pools))
    for j in np.flatnonzero(latent):
        twin = model.ids.index(model.ids[j].replace("latent", "elastic"))
        np.testing.assert_allclose(at_half[j], 1.5 * model.base_demand[twin], rtol=1e-6, atol=1e-9)
        assert model.population.budget[j].item() == pytest.approx(  # (1 + headroom) x spend at p0 / 2
            1.25 * 0.5 * 1.5 * float((model.base_demand[twin] * [p.prices.list_price for p in pools]).sum())
        )
    none, _ = _model(0.0)
    assert not none.latent_mask.any() and none.size == model.size - 4


def test_static_run_is_unchanged_by_latent_demand():
    with_latent = inputs(
        days=0.5, economics=EconomicAssumptions(tenants_per_class=4, latent_elastic_ratio=1.0)
    )
    without = inputs(days=0.5, economics=EconomicAssumptions(tenants_per_class=4, latent_elastic_ratio=0.0))
    a = StrategyRun(with_latent, make_strategy("static", with_latent)).run().metrics
    b = StrategyRun(without, make_strategy("static", without)).run().metrics
    for key in ("revenue", "gpu_utilization", "elastic_gpu_hours", "rigid_gpu_hours", "jobs_started"):
        assert a[key] == b[key], key  # separate generators: the trace tenants' stream is the same
    assert a["latent_elastic_gpu_hours"] == 0.0


def test_stackelberg_sells_latent_work_below_list_and_reports_it_apart():
    run_inputs = inputs(days=1.0, ratio=0.4, economics=EconomicAssumptions(tenants_per_class=4))
    m = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs)).run().metrics
    assert m["latent_elastic_gpu_hours"] > 0
    assert m["trace_elastic_cost_per_gpu_hour"] is not None
    lists = [p.prices.list_price for p in run_inputs.pools]
    assert m["latent_elastic_revenue"] / m["latent_elastic_gpu_hours"] < max(lists)  # bought below list


def test_meter_splits_latent_billing_and_restarts_after_warmup():
    meter = Meter(1, 4)
    meter.change(0, 0.0, ELASTIC, alloc=2.0, bill=2.0)
    meter.change(0, 0.0, ELASTIC, alloc=1.0, bill=1.0, latent=True)
    meter.change(0, 0.0, RIGID, alloc=1.0, bill=1.0)
    prices = np.array([2.0, 1.0])
    meter.close_tick(0, 3600.0, 3600.0, prices, np.array([8.0]), np.array([1.0]), np.array([0.05]))
    assert meter.latent_revenue == pytest.approx(1.0)
    assert meter.latent_billed_gpu_hours == pytest.approx(1.0)
    assert meter.revenue_by_class.tolist() == pytest.approx([2.0, 3.0])
    meter.restart()
    assert meter.revenue_by_class.sum() == 0 and meter.latent_revenue == 0 and meter.cost == 0
    meter.close_tick(1, 7200.0, 3600.0, prices, np.array([8.0]), np.array([1.0]), np.array([0.05]))
    assert meter.revenue_by_class.tolist() == pytest.approx([2.0, 3.0])  # jobs kept running
    meter.trim(1)
    assert meter.prices.shape[0] == 3


def test_warmup_is_run_but_not_measured():
    cold = inputs(days=0.5, economics=EconomicAssumptions(tenants_per_class=4))
    warm = inputs(days=0.5, economics=EconomicAssumptions(tenants_per_class=4))
    warm = dataclasses.replace(warm, settings=warm.settings.with_(warmup_days=0.25))
    warm = dataclasses.replace(warm, load_index=np.concatenate([np.ones(6), warm.load_index]))
    a = StrategyRun(cold, make_strategy("static", cold)).run()
    b = StrategyRun(warm, make_strategy("static", warm)).run()
    assert a.series["prices"].shape == b.series["prices"].shape == (12, 2 * len(cold.pools))
    assert b.metrics["revenue"] != a.metrics["revenue"]  # another stretch of the same stream


class _Halving:
    """A strategy that halves the drainable prices every round, down to a floor."""

    name, drains = "halving", False

    def __init__(self, floor: np.ndarray) -> None:
        self.floor = floor

    def decide(self, view) -> PriceDecision:
        prices = view.last_prices.copy()
        prices[1::2] = np.maximum(prices[1::2] * 0.5, self.floor[1::2])
        return PriceDecision(prices)


def test_each_run_opens_from_its_own_prices_steady_state():
    run_inputs = inputs(days=0.5, economics=EconomicAssumptions(tenants_per_class=4))
    model, pools = run_inputs.model, run_inputs.pools
    lists = list_price_vector(pools)
    held = np.zeros((len(pools), 2))
    capacity = np.array([p.gpus for p in pools], dtype=float)
    assert np.array_equal(opening_prices(StaticPricing(pools), capacity, held, np.ones(3), lists), lists)
    floor = 0.3 * lists
    settled = opening_prices(_Halving(floor), capacity, held, np.ones(3), lists)
    np.testing.assert_allclose(settled[1::2], floor[1::2])  # rounds run until the prices settle
    same = opening_jobs(model, run_inputs.pods, lists, 1.0, 0, run_inputs.initial, lists)
    assert same is run_inputs.initial  # static / utilisation: the shared list-price snapshot
    cheap = opening_jobs(model, run_inputs.pods, settled, 1.0, 0, run_inputs.initial, lists)
    gpus = run_inputs.pods.gpus
    elastic = model.elastic
    assert gpus[cheap.pod][elastic[cheap.tenant]].sum() > gpus[same.pod][elastic[same.tenant]].sum()
    assert not elastic[cheap.tenant][: np.argmax(elastic[cheap.tenant])].any()  # rigid jobs placed first


def test_a_list_opening_starts_every_strategy_from_the_list_price_snapshot():
    """`opening="list"` (the truth grid's regret): a strategy that would open far below the list
    price starts from static's snapshot, at the list prices, like static; "own" does not."""
    own = inputs(days=0.25, economics=EconomicAssumptions(tenants_per_class=4))
    listed = dataclasses.replace(own, settings=own.settings.with_(opening="list"))
    floor = 0.3 * list_price_vector(own.pools)
    static = StrategyRun(listed, StaticPricing(own.pools))
    static_jobs = static.run().extra["opening_jobs"]
    from_list, from_own = StrategyRun(listed, _Halving(floor)), StrategyRun(own, _Halving(floor))
    assert np.array_equal(
        from_list._place_initial(list_price_vector(own.pools)), list_price_vector(own.pools)
    )
    assert from_list.opening_jobs == static_jobs
    opened = from_own._place_initial(list_price_vector(own.pools))
    np.testing.assert_allclose(opened[1::2], floor[1::2])
    assert from_own.opening_jobs > static_jobs  # cheaper drainable prices: more elastic jobs running
    with pytest.raises(SimulationInputError, match="opening"):
        own.settings.with_(opening="theirs")


def test_initial_cells_draw_independently_of_other_cells():
    run_inputs = inputs(days=0.5, economics=EconomicAssumptions(tenants_per_class=4))
    model = run_inputs.model
    demand = model.base_demand.copy()
    a = initial_population(model, run_inputs.pods, demand, seed=5)
    demand[model.elastic] *= 3.0
    b = initial_population(model, run_inputs.pods, demand, seed=5)
    rigid_a = sorted(zip(a.tenant[~model.elastic[a.tenant]], a.pod[~model.elastic[a.tenant]]))
    rigid_b = sorted(zip(b.tenant[~model.elastic[b.tenant]], b.pod[~model.elastic[b.tenant]]))
    assert rigid_a == rigid_b  # rigid cells: same demand, same jobs


def test_initial_cells_couple_across_demands():
    """A cell whose demand moves a little keeps its jobs but for those the count adds: the
    snapshot at the lower demand is a sub-multiset of the one at the higher (the strategies'
    snapshots differ by their prices, not by two unrelated samples)."""
    run_inputs = inputs(days=0.5, economics=EconomicAssumptions(tenants_per_class=4))
    model = run_inputs.model
    demand = model.base_demand * 5.0
    high = initial_population(model, run_inputs.pods, demand, seed=5)
    low = initial_population(model, run_inputs.pods, demand * 0.97, seed=5)

    def jobs(init):
        return Counter(
            zip(init.tenant.tolist(), init.pool.tolist(), init.pod.tolist(), init.remaining_s.tolist())
        )

    kept, grown = jobs(low), jobs(high)
    assert not kept - grown  # every job of the lower snapshot is in the higher one
    assert 0 < sum(grown.values()) - sum(kept.values()) < 0.1 * sum(grown.values())


def _pod(run_inputs, gpus: int) -> int:
    pods = run_inputs.pods
    return int(np.flatnonzero((pods.num_gpu == gpus) & (pods.gpu_milli == 1000))[0])


def _tenant(run_inputs, elastic: bool) -> int:
    model = run_inputs.model
    return int(np.flatnonzero((model.elastic == elastic) & ~model.latent_mask)[0])


def _add(run: StrategyRun, tenant: int, pool: int, pod: int, t: float) -> int:
    cls = ELASTIC if run.inputs.model.elastic[tenant] else RIGID
    job = run.jobs.add(tenant, pool, pod, cls, run.pod_gpus[pod], t, 36000.0)
    run._place_or_queue(job, t)
    return job


def test_a_rigid_job_spills_to_another_model_and_pays_its_own_pools_price():
    run_inputs = inputs(days=0.5, fleet={"A10": (1, 1), "G2": (2, 8)}, strategies=("static",))
    run = StrategyRun(run_inputs, make_strategy("static", run_inputs))  # not run: empty fleet
    a10, g2 = (next(p.index for p in run_inputs.pools if p.model == m) for m in ("A10", "G2"))
    pod, rigid, elastic = _pod(run_inputs, 1), _tenant(run_inputs, False), _tenant(run_inputs, True)
    first = _add(run, rigid, a10, pod, 0.0)
    second = _add(run, rigid, a10, pod, 0.0)  # the one A10 GPU is taken
    waiting = _add(run, elastic, a10, pod, 0.0)
    assert run.jobs.pool[first] == a10 and run.jobs.pool[second] == g2 and run.jobs.bill_pool[second] == a10
    assert run.jobs.state[waiting] == QUEUED and run.jobs.pool[waiting] == a10  # elastic work waits
    assert run.spilled == 1
    prices = np.repeat([p.prices.list_price for p in run_inputs.pools], 2)
    run.meter.close_tick(0, 3600.0, 3600.0, prices, run.capacity, run.unit_cost, run.serve_cost)
    assert run.meter.revenue_by_pool[a10, RIGID] == pytest.approx(
        2.0 * prices[2 * a10]
    )  # both at A10's price
    assert run.meter.revenue_by_pool[g2, RIGID] == 0.0
    assert run.meter.utilization[0, g2] == pytest.approx(1.0 / 16.0)  # ... though one runs on a G2


def test_drains_hold_the_room_for_the_rigid_job():
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(days=0.5, fleet={"G2": (10, 8)}, strategies=("stackelberg",), economics=economics)
    run_inputs = with_guarantee(run_inputs, empty_nodes_kept=0)  # every node may fill
    run = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs))
    half, whole = _pod(run_inputs, 4), _pod(run_inputs, 8)
    elastic, rigid = _tenant(run_inputs, True), _tenant(run_inputs, False)
    victims = [_add(run, elastic, 0, half, 0.0) for _ in range(20)]  # two 4-GPU jobs on every node
    assert all(run.jobs.state[v] == RUNNING for v in victims)
    arrival = 7200.0  # past the landing cool-down
    job = _add(run, rigid, 0, whole, arrival)
    assert run.jobs.state[job] == QUEUED and job not in run.awaited  # drains come at control steps
    t = arrival + run.control_s
    run._until(t)
    run._retry_drains(t)
    assert len(run.awaited[job]) == 2
    drained = sorted(run.awaited[job])
    run._until(t + run.drainer.seconds)
    assert run.jobs.state[job] == RUNNING  # the second victim's release completed the room
    assert run.jobs.first_start[job] - t == pytest.approx(run.drainer.seconds)
    node = run.jobs.placement[job].node
    assert all(run.jobs.placement[v] is None or run.jobs.placement[v].node != node for v in drained)
    assert all(run.jobs.state[v] == QUEUED for v in drained)  # the fleet is full: they wait


def test_elastic_work_leaves_the_last_whole_node_to_rigid_work():
    run_inputs = inputs(days=0.5, fleet={"G2": (10, 8)}, strategies=("static",))
    pool = run_inputs.pools[0]
    one = next(r for r in run_inputs.requests if r.num_gpu == 1 and r.gpu_milli == 1000)
    whole = next(r for r in run_inputs.requests if r.num_gpu == 8)
    kept = PoolCluster(pool, run_inputs.nodes, "best_fit", run_inputs.typical, list(run_inputs.requests), 1)
    taken = [kept.place(one, elastic=True) for _ in range(72)]  # fills nine of the ten nodes
    assert all(p is not None for p in taken)
    assert kept.place(one, elastic=True) is None  # the last empty node is kept ...
    assert kept.place(whole) is not None  # ... for the rigid whole-node job
    free = PoolCluster(pool, run_inputs.nodes, "best_fit", run_inputs.typical, list(run_inputs.requests), 0)
    for _ in range(73):
        assert free.place(one, elastic=True) is not None  # without the reserve it is taken
    kept.release(one, taken[0])
    assert kept.free_top == 0 and kept.place(one, elastic=True) is not None  # a partly used node is fine
    small = inputs(days=0.5, fleet={"G2": (9, 8)}, strategies=("static",))
    assert (
        PoolCluster(small.pools[0], small.nodes, "best_fit", small.typical, list(small.requests), 1).reserve
        == 0
    )
    # at most one kept per ten largest nodes: asked for two, 17 nodes keep one and 20 keep two
    for nodes, reserve in ((17, 1), (20, 2)):
        pool_inputs = inputs(days=0.5, fleet={"G2": (nodes, 8)}, strategies=("static",))
        cluster = PoolCluster(
            pool_inputs.pools[0],
            pool_inputs.nodes,
            "best_fit",
            pool_inputs.typical,
            list(pool_inputs.requests),
            2,
        )
        assert cluster.reserve == reserve


def test_rigid_price_index_holds_the_static_mix_fixed():
    static = {"extra": {"rigid_gpu_hours_by_pool": [100.0, 100.0], "rigid_revenue_by_pool": [100.0, 200.0]}}
    stack = {"extra": {"rigid_gpu_hours_by_pool": [50.0, 150.0], "rigid_revenue_by_pool": [52.5, 315.0]}}
    assert rigid_price_index(stack, static) == pytest.approx(1.05)
    static.update(revenue=300.0, rigid_cost_per_gpu_hour=1.5)
    stack.update(revenue=367.5, rigid_cost_per_gpu_hour=367.5 / 200.0)
    checks = target_checks({"static": static, "stackelberg": stack}, {}, None)
    assert checks["rigid_cost_vs_static"]["pass"] is False  # the mix moved to the dear pool
    assert checks["rigid_price_index_vs_static"]["pass"] is True
    assert rigid_price_index(stack, {"extra": {}}) is None


class _Recording:
    """A strategy that posts the list prices and keeps every view it was shown."""

    name, drains = "recording", False

    def __init__(self, pools) -> None:
        self.prices = list_price_vector(pools)
        self.views: list = []

    def decide(self, view) -> PriceDecision:
        self.views.append(view)
        return PriceDecision(self.prices.copy())


def test_the_opening_view_shows_what_the_list_snapshot_leaves_waiting():
    """A pool the list-price snapshot overloads opens with that work waiting, as static
    pricing's run places it (before, the view held the whole snapshot running and nothing
    waiting: guaranteed work the pool could not serve looked served, #46)."""
    base = inputs(days=0.25, economics=EconomicAssumptions(tenants_per_class=4))
    model, lists = base.model, list_price_vector(base.pools)
    crowded = dataclasses.replace(
        base, initial=initial_population(model, base.pods, model.base_demand * 8.0, seed=0)
    )
    recorder = _Recording(base.pools)
    StrategyRun(crowded, recorder)._place_initial(lists)
    static = StrategyRun(crowded, StaticPricing(base.pools))
    static._place_initial(lists)
    opening = recorder.views[0]
    np.testing.assert_allclose(opening.allocated, static.meter.allocated())
    np.testing.assert_allclose(opening.pending, static.meter.waiting())
    assert opening.pending[:, RIGID].sum() > 0  # guaranteed work waits from the start
    gpus = base.pods.gpus[crowded.initial.pod]
    assert opening.allocated.sum() + opening.pending.sum() == pytest.approx(gpus.sum())


def test_the_market_asks_no_premium_where_guaranteed_work_waits_with_nothing_to_drain():
    """With `premium_follows_reach`: pool 0 is full of guaranteed work and as much again
    waits. With no drainable work there, no drain can serve it: the guaranteed price is list
    (`guarantee_reach` 0). With drainable work holding as many GPUs as wait, the same backlog
    is priced over list."""
    run_inputs = with_guarantee(
        inputs(days=0.25, economics=EconomicAssumptions(tenants_per_class=4)), premium_follows_reach=True
    )
    pools = run_inputs.pools
    lists = list_price_vector(pools)
    capacity = np.array([p.gpus for p in pools], dtype=float)
    in_force = lists.copy()
    in_force[0::2] *= 1.04  # the cap, where an overloaded pool's guaranteed price sits

    def guaranteed_price(drainable_share: float) -> float:
        allocated = np.zeros((len(pools), 2))
        allocated[:, RIGID] = 0.5 * capacity
        allocated[0] = [(1 - drainable_share) * capacity[0], drainable_share * capacity[0]]
        pending = np.zeros_like(allocated)
        pending[0, RIGID] = capacity[0]
        view = MarketView(0, 0.0, capacity, allocated, pending, np.ones(48), in_force.copy())
        return float(make_strategy("claims", run_inputs).decide(view).prices[0])

    assert guaranteed_price(0.0) == pytest.approx(lists[0])
    assert guaranteed_price(1.0) > lists[0] * 1.01
    run_inputs = with_guarantee(run_inputs, premium_follows_reach=False)  # the default: the cap alone
    assert guaranteed_price(0.0) > lists[0] * 1.01


@pytest.mark.parametrize("refill", [True, False])
def test_the_empty_nodes_whole_node_jobs_took_are_refilled_from_a_node_without_rigid_work(refill):
    """`G2` with 20 nodes of 8 GPUs keeps two empty for whole-node rigid work (rule 6). Two
    whole-node rigid jobs take them; a drainable job then ends on a node of drainable work
    alone. With `refill_empty_nodes` that node, the nearest to empty without rigid work, takes
    no new drainable job (it waits), so churn empties it; a rigid job may still land there.
    Without, the drainable job takes the room at once. The per-node count of rigid jobs,
    which decides what may refill, follows their starts and ends."""
    run_inputs = inputs(days=0.5, fleet={"G2": (20, 8)}, strategies=("static",))
    run_inputs = with_guarantee(run_inputs, empty_nodes_kept=2, refill_empty_nodes=refill)
    run = StrategyRun(run_inputs, make_strategy("static", run_inputs))
    cluster = run.clusters[0]
    half, whole, one = _pod(run_inputs, 4), _pod(run_inputs, 8), _pod(run_inputs, 1)
    elastic, rigid = _tenant(run_inputs, True), _tenant(run_inputs, False)
    drainable = [_add(run, elastic, 0, half, 0.0) for _ in range(36)]  # 18 nodes, two each
    assert all(run.jobs.state[j] == RUNNING for j in drainable) and cluster.free_top == 2
    assert _add(run, elastic, 0, half, 0.0) in run.queues[0][ELASTIC][(4, 1000)]  # the two are kept
    whole_jobs = [_add(run, rigid, 0, whole, 0.0) for _ in range(2)]
    assert all(run.jobs.state[j] == RUNNING for j in whole_jobs) and cluster.free_top == 0
    assert cluster.rigid_jobs.sum() == 2 and cluster.rigid_jobs.max() == 1
    ended = drainable[0]
    node = run.jobs.placement[ended].node
    run._finish(ended, 60.0)  # the queued drainable job is offered the room first
    newcomer = _add(run, elastic, 0, half, 60.0)
    placed = [j for j in (drainable[-1] + 1, newcomer) if run.jobs.state[j] == RUNNING]
    if refill:
        assert placed == [] and cluster.node_free[node] == 4000  # kept for churn to empty
        guaranteed = _add(run, rigid, 0, one, 60.0)
        assert run.jobs.placement[guaranteed].node == node  # best fit: the only room there is
        assert cluster.rigid_jobs[node] == 1
    else:
        assert len(placed) == 1 and run.jobs.placement[placed[0]].node == node
    run._finish(whole_jobs[0], 120.0)
    assert cluster.rigid_jobs.sum() == (2 if refill else 1)
