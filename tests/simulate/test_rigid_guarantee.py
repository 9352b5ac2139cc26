"""The rigid guarantee: capacity held for waiting rigid work (`placement.guarantee`), used by
the simulator's placement, and the promise checked per tick against static pricing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from simulate_testkit import config, inputs, with_guarantee

from market_pipeline.lab.simulate.engine import StrategyRun
from market_pipeline.lab.simulate.guarantee import guarantee_check
from market_pipeline.lab.simulate.jobs import DONE, DRAINING, QUEUED, RUNNING
from market_pipeline.lab.simulate.metrics import StrategyResult
from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID
from market_pipeline.lab.simulate.runner import make_strategy
from market_pipeline.lab.simulate.settings import EconomicAssumptions
from market_pipeline.placement.capacity import ClusterCapacity, Placement, PodRequest
from market_pipeline.placement.guarantee import (
    choose_arrival,
    choose_outside,
    closed_nodes,
    held_nodes,
    hold_limit,
    shortfall,
)
from market_pipeline.placement.policies import BestFit


def _cap(nodes: int = 3) -> ClusterCapacity:
    return ClusterCapacity.build(
        [f"n{i}" for i in range(nodes)], ["G2"] * nodes, [8] * nodes, [64_000] * nodes, [256_000] * nodes
    )


def test_the_oldest_rigid_job_holds_the_node_nearest_to_fitting_it_and_elastic_work_keeps_off():
    cap = _cap()
    one = PodRequest(1, 1000, 1000, 1000)
    for node, used in ((0, 6), (1, 2), (2, 7)):  # free: 2, 6 and 1 GPUs
        cap.schedulable[:] = np.arange(3) == node
        for _ in range(used):
            cap.allocate(one, BestFit().choose(cap, one))
    cap.schedulable[:] = True
    whole = PodRequest(8, 1000, 8000, 8000)
    assert np.argmin(shortfall(cap, whole)) == 1  # six of its eight GPUs are free there
    held = held_nodes(cap, [whole, whole], max_nodes=1)
    assert held.tolist() == [False, True, False]  # one node only: the limit
    before = cap.schedulable.copy()
    placement = choose_outside(BestFit(), cap, PodRequest(1, 1000, 1000, 1000), held)
    assert placement is not None and placement.node != 1
    three = PodRequest(3, 1000, 1000, 1000)  # only the held node has three free GPUs
    assert choose_outside(BestFit(), cap, three, held) is None  # elastic: it waits
    assert BestFit().choose(cap, three).node == 1  # without the hold it would take them
    assert (cap.schedulable == before).all()  # the choice left the capacity as it was
    assert held_nodes(cap, [PodRequest(8, 1000, 100_000, 0)], max_nodes=3).sum() == 0  # no node could host it
    assert hold_limit(40, 0.1) == 4 and hold_limit(3, 0.1) == 1 and hold_limit(40, 0.0) == 0


def test_new_guaranteed_work_takes_a_held_node_only_where_it_fits_nowhere_else():
    cap = _cap(2)
    for node, used, cpu in ((0, 2, 31_000), (1, 6, 500)):  # node 0: 6 GPUs, 2 cores free; node 1: 2 GPUs, 61
        cap.schedulable[:] = np.arange(2) == node
        for _ in range(used):
            req = PodRequest(1, 1000, cpu, 1000)
            cap.allocate(req, BestFit().choose(cap, req))
    cap.schedulable[:] = True
    held = held_nodes(cap, [PodRequest(8, 1000, 1000, 1000)], max_nodes=1)
    assert held.tolist() == [True, False]  # the waiting whole-node job is nearest to fitting on node 0
    one = PodRequest(1, 1000, 1000, 1000)
    assert BestFit().choose(cap, one).node == 0  # best fit alone would take the held node
    assert choose_arrival(BestFit(), cap, one, held).node == 1  # it fits elsewhere: it goes there
    three = PodRequest(3, 1000, 1000, 1000)
    assert choose_arrival(BestFit(), cap, three, held).node == 0  # fits only on the held node
    assert choose_arrival(BestFit(), cap, PodRequest(7, 1000, 1000, 1000), held) is None


def _one_pool_run(enabled: bool, close_to_drainable: bool = True) -> StrategyRun:
    cfg = config()
    guardrails = cfg.guardrails
    promise = guardrails.rigid_guarantee.model_copy(
        update={"enabled": enabled, "close_to_drainable": close_to_drainable}
    )
    cfg = cfg.model_copy(update={"guardrails": guardrails.model_copy(update={"rigid_guarantee": promise})})
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(days=0.5, fleet={"G2": (2, 8)}, strategies=("static",), economics=economics)
    run_inputs = dataclasses.replace(run_inputs, config=cfg)
    return StrategyRun(run_inputs, make_strategy("static", run_inputs))


def _pod(run: StrategyRun, gpus: int) -> int:
    pods = run.inputs.pods
    return int(np.flatnonzero((pods.num_gpu == gpus) & (pods.gpu_milli == 1000))[0])


def _tenant(run: StrategyRun, elastic: bool) -> int:
    model = run.inputs.model
    return int(np.flatnonzero((model.elastic == elastic) & ~model.latent_mask)[0])


def _submit(run: StrategyRun, elastic: bool, pod: int, t: float, runtime: float) -> int:
    run._until(t)
    tenant = _tenant(run, elastic)
    job = run.jobs.add(tenant, 0, pod, ELASTIC if elastic else RIGID, run.pod_gpus[pod], t, runtime)
    run._place_or_queue(job, t)
    return job


@pytest.mark.parametrize("enabled", [True, False])
def test_a_waiting_rigid_whole_node_job_is_not_starved_by_elastic_backfill(enabled):
    """Two full 8-GPU nodes; an 8-GPU rigid job waits. Node 0's jobs end one by one, and
    each time a new 1-GPU elastic job arrives. Without the hold every freed GPU goes to the
    elastic newcomer and the rigid job waits for hours; with it, node 0 is held and the rigid
    job starts the moment its last job ends (the elastic jobs wait: they tolerate delay)."""
    run = _one_pool_run(enabled)
    one, eight = _pod(run, 1), _pod(run, 8)
    first = [_submit(run, True, one, 0.0, 100.0 * (k + 1)) for k in range(8)]  # node 0: end at 100..800
    assert {run.jobs.placement[j].node for j in first} == {0}
    [_submit(run, True, one, 0.0, 36_000.0) for _ in range(8)]  # node 1: long jobs
    rigid = _submit(run, False, eight, 50.0, 3600.0)
    assert run.jobs.state[rigid] == QUEUED
    late = [_submit(run, True, one, 150.0 + 100.0 * k, 36_000.0) for k in range(8)]
    run._until(1000.0)
    if enabled:
        assert run.jobs.state[rigid] == RUNNING
        assert run.jobs.first_start[rigid] == pytest.approx(800.0)  # the last short job's end
        assert all(run.jobs.state[j] in (QUEUED, RUNNING) for j in late)
    else:  # the old behaviour: the elastic newcomers took node 0 GPU by GPU
        assert run.jobs.state[rigid] == QUEUED
        assert all(run.jobs.state[j] == RUNNING for j in late)


def _result(waiting: list[int], late: list[int]) -> StrategyResult:
    return StrategyResult(
        "x", {}, {"rigid_waiting_late": np.array(waiting), "rigid_past_sla": np.array(late)}
    )


def test_the_rigid_promise_is_checked_on_every_tick_against_static():
    promise = config().guardrails.rigid_guarantee
    static = _result([3, 4, 5, 5], [0, 1, 2, 2])
    same = guarantee_check(static, _result([3, 4, 5, 5], [0, 1, 2, 2]), promise)
    assert same["breach_ticks"] == 0
    worse = guarantee_check(static, _result([3, 6, 5, 4], [0, 1, 3, 2]), promise)
    assert (
        worse["breach_ticks"] == 2 and worse["waiting_breach_ticks"] == 1 and worse["sla_breach_ticks"] == 1
    )
    assert worse["worst_waiting_excess_jobs"] == 2.0


def test_the_market_view_never_reports_negative_demand_from_float_drift():
    from market_pipeline.lab.simulate.pricing import MarketView

    allocated = np.array([[0.1 + 0.2 - 0.3 - 1e-16, 0.0], [2.0, 1.0]])  # an emptied pool's drift
    view = MarketView(0, 0.0, np.array([8.0, 8.0]), allocated, np.zeros((2, 2)), np.zeros(1), np.ones(4))
    assert (view.demand >= 0).all() and view.demand[1] == 3.0


def test_a_new_rigid_job_that_may_run_elsewhere_leaves_the_held_node_to_the_waiting_one():
    """Pool 0 (G2): 15 of its 16 GPUs busy, the node with the free GPU held for a waiting
    8-GPU rigid job that fits nowhere else. A new 1-GPU rigid job that fits the other pool goes
    there; the held GPU stays for the waiting job (before, the newcomer took it)."""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(
        days=0.5, fleet={"G2": (2, 8), "T4": (2, 4)}, strategies=("static",), economics=economics
    )
    run = StrategyRun(run_inputs, make_strategy("static", run_inputs))
    one, eight = _pod(run, 1), _pod(run, 8)
    assert run.inputs.pools[0].model == "G2"
    assert run.inputs.spill[0][one] == (1,) and run.inputs.spill[0][eight] == ()  # T4: 4-GPU nodes
    [_submit(run, True, one, 0.0, 36_000.0) for _ in range(15)]  # pool 0: 15 of 16 GPUs busy
    waiting = _submit(run, False, eight, 10.0, 3600.0)
    assert run.jobs.state[waiting] == QUEUED and run.jobs.pool[waiting] == 0
    newcomer = _submit(run, False, one, 20.0, 3600.0)
    assert run.jobs.state[newcomer] == RUNNING and run.jobs.pool[newcomer] == 1  # spilled
    assert run.clusters[0].free_gpus() == 1.0  # the held GPU is still free


def test_the_nodes_of_a_waiting_guaranteed_jobs_gpu_model_are_closed_to_drainable_work():
    cap = ClusterCapacity.build(
        ["g2-a", "g2-b", "g2-cordoned", "t4"],
        ["G2", "G2", "G2", "T4"],
        [8, 4, 8, 4],
        [64_000] * 4,
        [256_000] * 4,
    )
    cap.schedulable[2] = False
    eight, one = PodRequest(8, 1000, 1000, 1000, ("G2",)), PodRequest(1, 1000, 1000, 1000)
    assert closed_nodes(cap, [eight]).tolist() == [True, True, False, False]  # its model, schedulable
    assert closed_nodes(cap, [eight, one]).tolist() == [True, True, False, True]  # any model: all
    assert not closed_nodes(cap, []).any()  # nothing waits: nothing closed
    assert choose_outside(BestFit(), cap, one, closed_nodes(cap, [eight])).node == 3


@pytest.mark.parametrize("close", [True, False])
def test_drainable_work_keeps_off_a_pool_where_rigid_work_waits(close):
    """Two 8-GPU nodes, 7 GPUs busy on each; a 2-GPU rigid job waits and holds node 0. A new
    1-GPU elastic job would take node 1's last GPU; the pool closed to it, it waits, and when one of
    node 1's jobs ends the rigid job starts there. Held nodes alone (the old rule) let it
    take the GPU, and the rigid job still waits."""
    run = _one_pool_run(True, close_to_drainable=close)
    one, two = _pod(run, 1), _pod(run, 2)
    [_submit(run, True, one, 0.0, 36_000.0 if k else 5.0) for k in range(8)]  # node 0: one ends at 5 s
    [_submit(run, True, one, 0.0, 36_000.0 if k else 500.0) for k in range(7)]  # node 1: at 500 s
    assert [run.jobs.placement[j].node for j in range(15)] == [0] * 8 + [1] * 7
    rigid = _submit(run, False, two, 10.0, 3600.0)
    assert run.jobs.state[rigid] == QUEUED
    newcomer = _submit(run, True, one, 20.0, 36_000.0)
    run._until(600.0)
    if close:
        assert run.jobs.state[newcomer] == QUEUED
        assert run.jobs.state[rigid] == RUNNING and run.jobs.first_start[rigid] == pytest.approx(500.0)
    else:
        assert run.jobs.state[newcomer] == RUNNING and run.jobs.placement[newcomer].node == 1
        assert run.jobs.state[rigid] == QUEUED


def test_a_waiting_rigid_job_backfills_past_an_older_one_the_freed_room_cannot_take():
    """Two 8-GPU nodes of 96 cores, full of 11-core rigid jobs; a 24-core 1-GPU rigid job
    waits, then a 6-core one. One job of node 0 ends: a GPU and 19 cores free. The older
    job does not fit there; the younger one does and starts at once (as a newcomer of its
    shape would), where a FIFO queue per request shape kept it waiting behind the older."""
    run = _one_pool_run(True)
    rows = np.flatnonzero((run.inputs.pods.num_gpu == 1) & (run.inputs.pods.gpu_milli == 1000))[:3]
    requests = list(run.inputs.requests)
    for row, cores in zip(rows.tolist(), (11_000, 24_000, 6_000)):
        requests[row] = PodRequest(1, 1000, cores, 24_000)
    run.inputs = dataclasses.replace(run.inputs, requests=tuple(requests))
    filler, big, small = rows.tolist()
    full = [_submit(run, False, filler, 0.0, 36_000.0 if k else 100.0) for k in range(16)]
    assert [run.jobs.placement[j].node for j in full] == [0] * 8 + [1] * 8
    older = _submit(run, False, big, 10.0, 3600.0)
    younger = _submit(run, False, small, 20.0, 3600.0)
    assert run.jobs.state[older] == QUEUED and run.jobs.state[younger] == QUEUED
    run._until(150.0)
    assert run.jobs.state[younger] == RUNNING and run.jobs.first_start[younger] == pytest.approx(100.0)
    assert run.jobs.state[older] == QUEUED  # 19 free cores: it still waits for its room


@pytest.mark.parametrize("churn", [True, False])
def test_a_rigid_job_the_pools_churn_starts_before_the_next_control_step_drains_nothing(churn):
    """One 8-GPU node holding two 4-GPU elastic jobs (past their landing cool-down); a 4-GPU
    rigid job arrives. Drains are planned at control steps, as the live drain planner runs, not
    on arrival: where one elastic job ends 100 s later, the rigid job starts then and nobody is
    drained (drained on arrival, one of that tenant's daily drains went on a wait the churn
    ended anyway). Where none ends, the next step drains for it, within its SLA wait."""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(days=0.5, fleet={"G2": (1, 8)}, strategies=("stackelberg",), economics=economics)
    run = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs))
    assert run.drainer is not None and run.control_s == 300.0
    four = _pod(run, 4)
    t = 7200.0  # past the landing cool-down
    short, long = (
        _submit(run, True, four, 0.0, runtime) for runtime in (t + 100.0 if churn else 36_000.0, 36_000.0)
    )
    rigid = _submit(run, False, four, t, 3600.0)
    assert run.jobs.state[rigid] == QUEUED and run.meter.drains == 0
    run._until(t + 150.0)
    if churn:
        assert run.jobs.state[rigid] == RUNNING and run.jobs.first_start[rigid] == pytest.approx(t + 100.0)
        assert run.meter.drains == 0 and run.jobs.state[long] == RUNNING and run.jobs.state[short] == DONE
        return
    assert run.jobs.state[rigid] == QUEUED
    run._control(t + 300.0)  # the next control step
    assert run.meter.drains == 1
    run._until(t + 600.0)
    assert run.jobs.state[rigid] == RUNNING
    assert run.jobs.first_start[rigid] - t == pytest.approx(300.0 + run.drainer.seconds)


def _offered_drains(run: StrategyRun, t: float) -> list[int]:
    """The waiting rigid jobs a control step at `t` offers drains to, in order."""
    offered: list[int] = []
    plan = run._drain_for

    def spy(job: int, now: float) -> bool:
        offered.append(job)
        return plan(job, now)

    run._drain_for = spy  # type: ignore[method-assign]
    run._retry_drains(t)
    return offered


def test_every_waiting_rigid_job_is_offered_drains_at_a_control_step():
    """Five 1-GPU rigid jobs of one shape wait in a full pool. Their drains come only from
    the control steps, so each step offers them to every waiting job, not only to the first
    four of its shape (as when arrivals drained at once and the step only retried)."""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(days=0.5, fleet={"G2": (1, 8)}, strategies=("stackelberg",), economics=economics)
    run = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs))
    one = _pod(run, 1)
    [_submit(run, True, one, 0.0, 36_000.0) for _ in range(8)]
    waiting = [_submit(run, False, one, 7200.0 + k, 3600.0) for k in range(5)]
    assert all(run.jobs.state[j] == QUEUED for j in waiting) and run.meter.drains == 0
    assert _offered_drains(run, 7500.0) == waiting


@pytest.mark.parametrize(
    ("mode", "order"),
    [("oldest_first", ["late", "in_time"]), ("after_in_time", ["in_time", "late"]), ("never", ["in_time"])],
)
def test_a_control_step_drains_first_for_the_rigid_job_still_in_time(mode, order):
    """A full pool; one rigid job has waited an hour (late whatever is drained), one 200 s
    (due, and drains now still start it within its 600 s SLA wait). `late_drains` decides
    whom the step's drains are offered to, in what order (`placement.guarantee.drain_order`,
    the live planner's order too)."""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = with_guarantee(
        inputs(days=0.5, fleet={"G2": (1, 8)}, strategies=("stackelberg",), economics=economics),
        late_drains=mode,
    )
    run = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs))
    one = _pod(run, 1)
    [_submit(run, True, one, 0.0, 36_000.0) for _ in range(8)]
    jobs = {
        "late": _submit(run, False, one, 3900.0, 3600.0),
        "in_time": _submit(run, False, one, 7300.0, 3600.0),
    }
    assert _offered_drains(run, 7500.0) == [jobs[name] for name in order]


@pytest.mark.parametrize("latest", [True, False])
def test_a_partial_node_rigid_job_is_drained_for_at_the_latest_step_still_in_time(latest):
    """One 8-GPU node full of 1-GPU elastic jobs; a 1-GPU rigid job arrives 150 s before a
    control step. With `drain_at_latest_step` (600 s SLA wait, 120 s drains, 300 s steps: due
    after 180 s) that step leaves it to the pool's churn, and the next one, at 450 s of waiting,
    drains for it: it starts at 570 s, within its SLA wait. Off, the first step drains for it
    (a drain the churn may have made needless, spending one of the tenant's daily drains)."""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = with_guarantee(
        inputs(days=0.5, fleet={"G2": (1, 8)}, strategies=("stackelberg",), economics=economics),
        drain_at_latest_step=latest,
    )
    run = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs))
    assert run.control_s == 300.0 and run.drain_after_s == (180.0 if latest else 0.0)
    one = _pod(run, 1)
    [_submit(run, True, one, 0.0, 36_000.0) for _ in range(8)]
    arrived = 7350.0  # past the elastic jobs' landing cool-down
    rigid = _submit(run, False, one, arrived, 3600.0)
    assert run.jobs.state[rigid] == QUEUED
    run._control(7500.0)
    assert run.meter.drains == (0 if latest else 1)
    run._control(7800.0)
    assert run.meter.drains == 1
    run._until(8400.0)
    assert run.jobs.state[rigid] == RUNNING
    step = 7800.0 if latest else 7500.0
    assert run.jobs.first_start[rigid] - arrived == pytest.approx(step - arrived + run.drainer.seconds)
    assert run.jobs.first_start[rigid] - arrived <= run.inputs.sla_wait_s


def _start_on(run: StrategyRun, elastic: bool, pod: int, node: int, slots: tuple[int, ...]) -> int:
    """A job running since 0 on the given GPUs of pool 0 (placed by hand, not by the policy)."""
    job = run.jobs.add(
        _tenant(run, elastic), 0, pod, ELASTIC if elastic else RIGID, run.pod_gpus[pod], 0.0, 36_000.0
    )
    placement = Placement(node, slots, 1000)
    cluster = run.clusters[0]
    cluster.cap.allocate(run.inputs.requests[pod], placement)
    cluster._update(node)
    run._start(job, placement, 0.0)
    return job


def test_a_newcomer_keeps_off_the_node_being_drained_for_a_waiting_rigid_job():
    """Two 8-GPU nodes: node 0 runs one 1-GPU rigid job, node 1 two 2-GPU elastic jobs. An
    8-GPU rigid job waits: node 0 is held for it (nearest to fitting), and the control step
    drains node 1 (the only drainable room). A 1-GPU rigid job arriving during the drain
    fits node 1's free GPUs; it lands on the held node 0 instead, and the waiting job starts
    on node 1 the moment the drain is done. (Landing on node 1, it took the room the drain
    made: the waiting job waited for the next control step's drains, past its SLA wait.)"""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(days=0.5, fleet={"G2": (2, 8)}, strategies=("stackelberg",), economics=economics)
    run = StrategyRun(run_inputs, make_strategy("stackelberg", run_inputs))
    assert run.drainer is not None
    one, two, eight = _pod(run, 1), _pod(run, 2), _pod(run, 8)
    _start_on(run, False, one, 0, (0,))
    victims = [_start_on(run, True, two, 1, slots) for slots in ((0, 1), (2, 3))]
    t = 7200.0  # past the elastic jobs' landing cool-down
    waiting = _submit(run, False, eight, t, 3600.0)
    assert run.jobs.state[waiting] == QUEUED
    run._control(t + 300.0)
    assert all(run.jobs.state[v] == DRAINING for v in victims)
    newcomer = _submit(run, False, one, t + 330.0, 3600.0)
    assert run.jobs.state[newcomer] == RUNNING and run.jobs.placement[newcomer].node == 0
    run._until(t + 300.0 + run.drainer.seconds)
    assert run.jobs.state[waiting] == RUNNING and run.jobs.placement[waiting].node == 1
    assert run.jobs.first_start[waiting] - t == pytest.approx(300.0 + run.drainer.seconds)
    assert not run.clusters[0].drains_under_way.any()  # the node is open to newcomers again


@pytest.mark.parametrize("window_minutes", [60.0, 0.0])
def test_elastic_work_keeps_off_the_node_reserved_for_forecast_rigid_arrivals(window_minutes):
    """Two 8-GPU nodes, node 1 running seven 1-GPU elastic jobs, no rigid job waiting. An
    8-GPU rigid job arrived in the last hour, so one is forecast within the SLA wait: the
    control step reserves node 0, the only node it fits. A 2-GPU elastic job then waits
    (elastic work tolerates delay), and the next 8-GPU rigid arrival starts at once on node 0.
    Without the reserve the elastic job takes node 0 and the rigid arrival waits for drains."""
    cfg = config()
    guardrails = cfg.guardrails
    promise = guardrails.rigid_guarantee.model_copy(update={"forecast_window_minutes": window_minutes})
    cfg = cfg.model_copy(update={"guardrails": guardrails.model_copy(update={"rigid_guarantee": promise})})
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(days=0.5, fleet={"G2": (2, 8)}, strategies=("static",), economics=economics)
    run = StrategyRun(dataclasses.replace(run_inputs, config=cfg), make_strategy("static", run_inputs))
    one, two, eight = _pod(run, 1), _pod(run, 2), _pod(run, 8)
    for slot in range(7):
        _start_on(run, True, one, 1, (slot,))
    t = 7200.0
    run._arrive(_tenant(run, False), 0, eight, t - 1800.0)  # it runs on node 0, then ends
    first = len(run.jobs) - 1
    assert run.jobs.placement[first].node == 0
    run._until(t - 1800.0 + run.pod_runtime[eight] + 1.0)
    assert run.jobs.state[first] == DONE
    run._control(t)
    run._refresh_holds(0)  # re-picked when next asked, with the forecast of this control step
    assert run.clusters[0].reserved.tolist() == ([True, False] if window_minutes else [False, False])
    elastic = _submit(run, True, two, t + 1.0, 36_000.0)
    rigid = _submit(run, False, eight, t + 2.0, 3600.0)
    if window_minutes:
        assert run.jobs.state[elastic] == QUEUED
        assert run.jobs.state[rigid] == RUNNING and run.jobs.placement[rigid].node == 0
        run._arrive(_tenant(run, True), 0, one, t + 3.0)
        assert len(run.forecasts[0].records) == 1  # the rigid arrival is recorded; elastic ones are not
    else:
        assert run.jobs.placement[elastic].node == 0
        assert run.jobs.state[rigid] == QUEUED


def test_a_waiting_rigid_job_that_may_run_elsewhere_is_not_kept_there_by_an_older_one_that_may_not():
    """Pool 0 (G2, 8 GPUs) and pool 1 (T4, 4 GPUs) full. Two 1-GPU rigid jobs wait in pool 0:
    the older may run only there, the newer on T4 too. T4's jobs end; at the next control step
    the newer one spills to T4 (before, only the head of each GPU shape's queue tried the other
    pools, and a head that may go nowhere kept every job behind it waiting)."""
    economics = EconomicAssumptions(tenants_per_class=4)
    run_inputs = inputs(
        days=0.5, fleet={"G2": (1, 8), "T4": (1, 4)}, strategies=("static",), economics=economics
    )
    pods = run_inputs.pods
    pinned, free = (int(p) for p in np.flatnonzero((pods.num_gpu == 1) & (pods.gpu_milli == 1000))[:2])
    spill = [list(row) for row in run_inputs.spill]
    spill[0][pinned], spill[0][free] = (), (1,)  # the first may run only on G2 (say, its pod names it)
    run_inputs = dataclasses.replace(run_inputs, spill=tuple(tuple(row) for row in spill))
    run = StrategyRun(run_inputs, make_strategy("static", run_inputs))
    tenant = _tenant(run, True)
    for pool, jobs, runtime in ((0, 8, 36_000.0), (1, 4, 100.0)):  # both pools full; T4's end at 100 s
        for _ in range(jobs):
            job = run.jobs.add(tenant, pool, free, ELASTIC, 1.0, 0.0, runtime)
            run._place_or_queue(job, 0.0)
    assert run.clusters[0].free_gpus() == 0.0 and run.clusters[1].free_gpus() == 0.0
    older = _submit(run, False, pinned, 10.0, 3600.0)
    newer = _submit(run, False, free, 20.0, 3600.0)
    assert run.jobs.state[older] == run.jobs.state[newer] == QUEUED
    run._control(300.0)
    assert run.jobs.state[newer] == RUNNING and run.jobs.pool[newer] == 1  # spilled past the older one
    assert run.jobs.state[older] == QUEUED and run.jobs.pool[older] == 0
