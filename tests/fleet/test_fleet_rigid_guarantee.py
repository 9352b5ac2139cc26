"""The digital twin keeps the rigid guarantee's rule (`placement.guarantee`): a pending
guaranteed task holds the node nearest to fitting it, and drainable tasks keep off it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from market_pipeline.config import load_config
from market_pipeline.fleet import twin as twin_module
from market_pipeline.fleet.setup import build_setup
from market_pipeline.fleet.twin import FleetTwin
from market_pipeline.fleet.workload import Job
from market_pipeline.placement.policies import BestFit

EPOCH = 1_767_225_600


def _job(task_id: str, model: str, gpus: int, resource_class: str) -> Job:
    return Job(
        task_id=task_id,
        tenant_id="t",
        gpu_model=model,
        num_gpu=gpus,
        gpu_milli=1000,
        cpu_milli=1000,
        mem_mib=1000,
        qos="LS" if resource_class == "guaranteed" else "BE",
        kind="training",
        resource_class=resource_class,
        priority=0,
        do_not_drain=resource_class == "guaranteed",
        checkpointable=True,
        lifetime_s=36_000,
        arrival_ts=EPOCH,
        util_level=50.0,
        gpu_mem_share=0.5,
        checkpoint_s=10.0,
        exit_s=5.0,
        ignores_sigterm=False,
    )


def _two_nodes_one_gpu_free(hold_share: float) -> tuple[FleetTwin, str, int, int, int]:
    """A twin (the default setup, `hold_max_nodes_share` = hold_share, not closed to drainable work) where only two nodes
    r0, r1 of one model with at least 4 GPUs are schedulable: r1 full of drainable one-GPU
    tasks, r0 with one GPU free. Returns (twin, model, r0, r1, r0's width in GPUs)."""
    setup = build_setup(load_config(environ={}))
    # the hold alone: the closure of the whole GPU model and the empty-node reserve are tested on their own below
    params = dataclasses.replace(
        setup.params, hold_max_nodes_share=hold_share, close_to_drainable=False, empty_nodes_kept=0
    )
    twin = FleetTwin(setup.catalog, setup.workload, BestFit(), params, setup.seed, EPOCH)
    gpus = twin.cap.present.sum(axis=1)
    model = next(m for m in twin.cap.model_names if (gpus[twin.cap.model_allowed((m,))] >= 4).sum() >= 2)
    r0, r1 = np.flatnonzero(twin.cap.model_allowed((model,)) & (gpus >= 4))[:2]
    width = int(gpus[r0])
    for row, used in ((r1, int(gpus[r1])), (r0, width - 1)):  # node r1 full, node r0 with one GPU free
        twin.cap.schedulable[:] = False
        twin.cap.schedulable[row] = True
        for k in range(used):
            job = _job(f"{row}-{k}", model, 1, "drainable")
            twin._start(job, BestFit().choose(twin.cap, job.request()), EPOCH)
    twin.cap.schedulable[:] = False
    twin.cap.schedulable[[r0, r1]] = True
    return twin, model, int(r0), int(r1), width


@pytest.mark.parametrize("share", [1.0, 0.0])
def test_a_drainable_task_keeps_off_the_node_a_pending_guaranteed_task_holds(share):
    twin, model, r0, r1, width = _two_nodes_one_gpu_free(share)
    assert twin.cap.free_gpus(np.array([r0, r1])) == 1.0
    rigid = _job("rigid", model, width, "guaranteed")
    twin.pending.append(rigid)
    assert not twin._try_place(rigid, EPOCH)  # it needs the whole node: it waits
    newcomer = _job("newcomer", model, 1, "drainable")
    twin.pending.append(newcomer)
    placed = twin._try_place(newcomer, EPOCH)
    assert placed is (share == 0.0)  # with the hold the newcomer waits instead of taking r0's GPU


def test_a_new_guaranteed_task_takes_the_held_node_only_where_it_fits_nowhere_else():
    twin, model, r0, r1, width = _two_nodes_one_gpu_free(1.0)
    waiting = _job("waiting", model, width, "guaranteed")
    twin.pending.append(waiting)
    assert not twin._try_place(waiting, EPOCH)
    assert (
        twin._held(EPOCH)[r0] and not twin._held(EPOCH, but=waiting).any()
    )  # its own hold is not in its way
    newcomer = _job("newcomer", model, 1, "guaranteed")
    twin.pending.append(newcomer)
    assert twin._try_place(newcomer, EPOCH, arrival=True)  # r0's GPU is the only room: it takes it
    assert twin.running["newcomer"].placement.node == r0


class _CountingBestFit(BestFit):
    """Best fit that counts its searches."""

    def __init__(self) -> None:
        self.searches = 0

    def choose(self, cap, req):
        self.searches += 1
        return super().choose(cap, req)


def _one_gpu_free_on_two_nodes(close: bool, **params) -> tuple[FleetTwin, str, int, int, int]:
    """A twin (the default setup, holding up to every node, closed to drainable work where
    `close`) where only two nodes r0, r1 of one model are schedulable, each with one GPU free.
    Returns (twin, model, r0, r1, the nodes' width in GPUs); its policy counts its searches."""
    setup = build_setup(load_config(environ={}))
    assert setup.params.close_to_drainable  # the shipped config closes them
    replaced = dataclasses.replace(
        setup.params, hold_max_nodes_share=1.0, close_to_drainable=close, empty_nodes_kept=0, **params
    )
    twin = FleetTwin(setup.catalog, setup.workload, _CountingBestFit(), replaced, setup.seed, EPOCH)
    gpus = twin.cap.present.sum(axis=1)
    model = next(m for m in twin.cap.model_names if (gpus[twin.cap.model_allowed((m,))] >= 4).sum() >= 2)
    rows = np.flatnonzero(
        twin.cap.model_allowed((model,)) & (gpus == gpus[twin.cap.model_allowed((model,))].max())
    )
    r0, r1 = rows[:2]
    width = int(gpus[r0])
    for row in (r0, r1):  # one GPU free on each
        twin.cap.schedulable[:] = False
        twin.cap.schedulable[row] = True
        for k in range(width - 1):
            job = _job(f"{row}-{k}", model, 1, "drainable")
            twin._start(job, BestFit().choose(twin.cap, job.request()), EPOCH)
    twin.cap.schedulable[:] = False
    twin.cap.schedulable[[r0, r1]] = True
    return twin, model, int(r0), int(r1), width


@pytest.mark.parametrize("close", [True, False])
def test_a_drainable_task_keeps_off_the_gpu_model_a_guaranteed_task_waits_for(close):
    """Two nodes of one model with one GPU free each; a pending whole-node guaranteed task
    holds one of them. Closed to drainable work (the default), a new drainable task waits;
    with the hold alone it takes the other node's GPU."""
    twin, model, _, _, width = _one_gpu_free_on_two_nodes(close)
    rigid = _job("rigid", model, width, "guaranteed")
    twin.pending.append(rigid)
    assert not twin._try_place(rigid, EPOCH)
    assert twin._held(EPOCH).sum() == 1  # one node held: the other is free for the hold alone
    newcomer = _job("newcomer", model, 1, "drainable")
    twin.pending.append(newcomer)
    assert twin._try_place(newcomer, EPOCH) is (not close)


def test_a_drainable_task_of_a_closed_model_waits_without_a_search():
    """While guaranteed work of its model waits, a drainable task is refused without asking
    the policy (the search could only fail); once that backlog clears it is searched and placed."""
    twin, model, _, _, width = _one_gpu_free_on_two_nodes(close=True)
    rigid, drainable = _job("rigid", model, width, "guaranteed"), _job("drainable", model, 1, "drainable")
    twin.pending += [rigid, drainable]
    searches = twin.policy.searches
    assert not twin._try_place(drainable, EPOCH)
    assert twin.policy.searches == searches
    twin.pending.remove(rigid)  # the backlog cleared (a second later: the closure is per second)
    assert twin._try_place(drainable, EPOCH + 1)
    assert twin.policy.searches == searches + 1


@pytest.mark.parametrize("budget", [1, 2])
def test_a_refused_drainable_retry_still_spends_the_retry_budget(budget):
    """A freed GPU retries the queue [rigid, drainable, small guaranteed]: the rigid task cannot
    fit (screened out), the drainable one is refused without a search but spends one attempt
    as its failed search did, so with a budget of 1 the small guaranteed task waits, with 2 it
    takes the GPU: the screen changes no decision."""
    twin, model, r0, _, width = _one_gpu_free_on_two_nodes(close=True, pending_retry_budget=budget)
    small = _job("small", model, 1, "guaranteed")
    twin.pending += [
        _job("rigid", model, width, "guaranteed"),
        _job("drainable", model, 1, "drainable"),
        small,
    ]
    twin.schedule_pending(EPOCH, [r0])
    assert ("small" in twin.running) is (budget == 2)
    assert [j.task_id for j in twin.pending] == ["rigid", "drainable"] + ["small"] * (budget == 1)


def test_a_hold_inside_the_closure_is_not_ranked_and_one_outside_it_is(monkeypatch):
    """Closed to drainable work, a drainable task keeps off the closed model's nodes; the hold
    of its waiting guaranteed task lies inside them and is not ranked. A guaranteed task of
    another model that arrives later in the same second (after the closure was taken) is
    outside it: its hold is ranked, and the drainable tasks keep off its node too."""
    ranked = []
    rank = twin_module.held_nodes
    monkeypatch.setattr(twin_module, "held_nodes", lambda *a: ranked.append(a) or rank(*a))
    twin, model, r0, r1, width = _one_gpu_free_on_two_nodes(close=True)
    twin.pending.append(_job("rigid", model, width, "guaranteed"))
    off = twin._off_limits(EPOCH)
    assert not ranked and off[[r0, r1]].all() and off.sum() == 2
    other = next(m for m in twin.cap.model_names if m != model and twin.cap.model_allowed((m,)).any())
    rows = np.flatnonzero(twin.cap.model_allowed((other,)))[:1]
    twin.cap.schedulable[rows] = True
    late = _job("late", other, 1, "guaranteed")
    twin.pending.append(late)
    assert twin._held(EPOCH, but=late)[[r0, r1]].sum() == 1  # the late task's arrival, ranked
    off = twin._off_limits(EPOCH)
    assert len(ranked) == 2 and off[rows].all() and off.sum() == 3


def test_newcomers_keep_off_the_node_being_drained_while_guaranteed_work_waits():
    """Two nodes of one model, one GPU free on each; a whole-node guaranteed task waits, r0 is
    held for it, and the drain planner warns r1's drainable tasks. A new one-GPU guaranteed
    task fits r1's free GPU; it takes the held r0 instead (it fits nowhere else), and a new
    drainable task waits: r1's room goes to the work it is being emptied for
    (`placement.guarantee.keep_off_draining`). Once r1's tasks have exited it is open again."""
    from market_pipeline.fleet import operations

    twin, model, r0, r1, width = _one_gpu_free_on_two_nodes(False)
    waiting = _job("waiting", model, width, "guaranteed")
    twin.pending.append(waiting)
    assert not twin._try_place(waiting, EPOCH) and twin._held(EPOCH)[r0]
    on_r1 = sorted(t for t, task in twin.running.items() if task.placement.node == r1)
    for task_id in on_r1:
        assert operations.warn(twin, task_id, 30.0).ok
    draining = twin._draining()
    assert not twin._held(EPOCH)[r1] and draining is not None and draining[r1] and draining.sum() == 1
    newcomer = _job("newcomer", model, 1, "guaranteed")
    twin.pending.append(newcomer)
    assert twin._try_place(newcomer, EPOCH, arrival=True)
    assert twin.running["newcomer"].placement.node == r0
    drainable = _job("drainable", model, 1, "drainable")
    twin.pending.append(drainable)
    assert not twin._try_place(drainable, EPOCH)  # r0 is full now, r1 is being drained
    for task_id in on_r1:
        twin.finish(task_id, EPOCH, "drained", "exited after SIGTERM")
    assert twin._draining() is None and not twin.signalled


@pytest.mark.parametrize("window_s", [3600, 0])
def test_a_drainable_task_keeps_off_the_node_reserved_for_forecast_guaranteed_arrivals(window_s):
    """Two nodes of one model, r1 full, r0 with one GPU free, nothing pending. A one-GPU
    guaranteed task arrived (the twin's event path records it), so one is forecast within the
    horizon: r0, where it fits, is reserved, and a new drainable task waits; the next guaranteed
    arrival takes r0's GPU. Without the reserve the drainable task takes it. The forecast
    survives a state reload."""
    from market_pipeline.fleet.state import twin_from_state, twin_to_state

    twin, model, r0, r1, _ = _two_nodes_one_gpu_free(0.0)
    twin.params = dataclasses.replace(twin.params, reserve_window_s=window_s, reserve_horizon_s=600)
    twin.forecast = twin_module.GuaranteedForecast(window_s) if window_s else None
    first = _job("first", model, 1, "guaranteed")
    twin.push(EPOCH, "arrival", first.task_id, first)
    twin._process_events_at(EPOCH)
    assert twin.running["first"].placement.node == r0
    twin.finish("first", EPOCH + 60, "end", "completed")
    ts = EPOCH + 120
    drainable = _job("drainable", model, 1, "drainable")
    twin.pending.append(drainable)
    assert twin._try_place(drainable, ts) is (window_s == 0)
    if not window_s:
        return
    assert twin._reserved(ts)[[r0, r1]].tolist() == [True, False]
    stored = twin_to_state(twin, "builtin", 1)
    assert [row[1:3] for row in stored["guaranteed_arrivals"]] == [[1, 1000]]
    setup = build_setup(load_config(environ={}))
    reloaded = twin_from_state(stored, setup.catalog, setup.workload, BestFit(), twin.params, "test")
    assert [req for _, req in reloaded.forecast.records] == [first.request()]
    second = _job("second", model, 1, "guaranteed")
    twin.push(ts, "arrival", second.task_id, second)
    twin._process_events_at(ts)
    assert twin.running["second"].placement.node == r0


def _twin_on_a_large_model(**params: object) -> tuple[FleetTwin, str, np.ndarray, np.ndarray]:
    """The default setup's twin, with `params` changed (the guaranteed reserve off), a GPU model
    with ten or more largest nodes (rule 6 keeps one empty there), those nodes' rows and the
    GPUs of every node."""
    setup = build_setup(load_config(environ={}))
    twin = FleetTwin(
        setup.catalog,
        setup.workload,
        BestFit(),
        dataclasses.replace(setup.params, reserve_window_s=0, **params),
        setup.seed,
        EPOCH,
    )
    gpus = twin.cap.present.sum(axis=1)
    model = next(
        m for m in twin.cap.model_names if (twin.cap.model_allowed((m,)) & (gpus == gpus.max())).sum() >= 10
    )
    return twin, model, np.flatnonzero(twin.cap.model_allowed((model,)) & (gpus == gpus.max())), gpus


@pytest.mark.parametrize("keep", [1, 0])
def test_a_drainable_task_keeps_off_the_last_empty_node_kept_for_whole_node_guaranteed_work(keep):
    """A GPU model with ten or more largest nodes, of which only r_full (full of drainable
    one-GPU tasks) and r_empty (empty) are schedulable. With `empty_nodes_kept` = 1 (what the
    shipped 2 keeps in a model with 10-19 largest nodes) a new drainable task waits rather than
    take r_empty, and a guaranteed whole-node arrival starts there at once; with 0 the drainable
    task takes it."""
    assert build_setup(load_config(environ={})).params.empty_nodes_kept == 2
    twin, model, largest, gpus = _twin_on_a_large_model(empty_nodes_kept=keep)
    r_full, r_empty = largest[:2]
    twin.cap.schedulable[:] = np.arange(twin.cap.n_nodes) == r_full
    for k in range(int(gpus[r_full])):
        job = _job(f"full-{k}", model, 1, "drainable")
        twin._start(job, BestFit().choose(twin.cap, job.request()), EPOCH)
    twin.cap.schedulable[[r_full, r_empty]] = True
    drainable = _job("drainable", model, 1, "drainable")
    twin.pending.append(drainable)
    assert twin._try_place(drainable, EPOCH + 60) is (keep == 0)
    if keep:
        whole = _job("whole", model, int(gpus[r_empty]), "guaranteed")
        twin.push(EPOCH + 60, "arrival", whole.task_id, whole)
        twin._process_events_at(EPOCH + 60)
        assert twin.running["whole"].placement.node == r_empty


def test_a_second_drainable_task_in_the_same_second_keeps_off_the_last_empty_node():
    """Two empty nodes of a model with ten or more: a whole-node drainable task may take one
    (two are empty), and a drainable task placed in the same second must then leave the last
    one, though the kept nodes are worked out once per second."""
    twin, model, largest, gpus = _twin_on_a_large_model()
    r_a, r_b = largest[:2]
    twin.cap.schedulable[:] = False
    twin.cap.schedulable[[r_a, r_b]] = True
    ts = EPOCH + 60
    whole, small = _job("whole", model, int(gpus[r_a]), "drainable"), _job("small", model, 1, "drainable")
    twin.pending.extend([whole, small])
    assert twin._try_place(whole, ts)
    assert not twin._try_place(small, ts)
    (last,) = {int(r_a), int(r_b)} - {twin.running["whole"].placement.node}
    assert np.flatnonzero(twin._kept_empty(ts)).tolist() == [last]


@pytest.mark.parametrize("refill", [True, False])
def test_with_no_empty_node_left_a_node_without_guaranteed_work_refills_it_and_drainable_tasks_keep_off(
    refill,
):
    """A GPU model with ten or more largest nodes keeps one empty (`empty_nodes_kept`); two of
    them schedulable, neither empty: r_drain runs two drainable one-GPU tasks, r_guar one
    guaranteed task. With `refill_empty_nodes` the node without guaranteed work nearest to
    empty (r_drain, the only one) refills the stock: a new drainable task keeps off it and
    lands on r_guar, though best fit would take r_drain, the fuller; without, it takes
    r_drain. The twin counts the guaranteed tasks per node as they start and end."""
    assert build_setup(load_config(environ={})).params.refill_empty_nodes
    twin, model, largest, _ = _twin_on_a_large_model(empty_nodes_kept=1, refill_empty_nodes=refill)
    r_drain, r_guar = largest[:2]
    twin.cap.schedulable[:] = False
    for row, tasks in ((r_drain, ("drainable", "drainable")), (r_guar, ("guaranteed",))):
        twin.cap.schedulable[row] = True
        for k, resource_class in enumerate(tasks):
            job = _job(f"{row}-{k}", model, 1, resource_class)
            twin._start(job, BestFit().choose(twin.cap, job.request()), EPOCH)
        twin.cap.schedulable[row] = False
    twin.cap.schedulable[[r_drain, r_guar]] = True
    assert twin.guaranteed_on[[r_drain, r_guar]].tolist() == [0, 1] and twin.guaranteed_on.sum() == 1
    drainable = _job("drainable", model, 1, "drainable")
    twin.pending.append(drainable)
    assert twin._try_place(drainable, EPOCH + 60)
    assert twin.running["drainable"].placement.node == (r_guar if refill else r_drain)
    twin.finish(f"{r_guar}-0", EPOCH + 120, "end", "done")
    assert not twin.guaranteed_on.any()
