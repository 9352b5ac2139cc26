"""The live drain planner makes room for waiting guaranteed tasks (`GuaranteedWaiting`, #46):
the cheapest node's drainable tasks, all of them allowed or none."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from drain_testkit import T0, make_task, node, samples_for

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.disruption.budget import BudgetRule
from market_pipeline.drain.limits import DrainLedger, DrainLimits, DrainReason, LedgerEntry
from market_pipeline.drain.plan import PlanningInputs, SelectionPolicy, plan_drains
from market_pipeline.drain.queue_rules import close_to_drainable
from market_pipeline.drain.service import waiting_guaranteed
from market_pipeline.drain.triggers import MAX_WAITING_READ
from market_pipeline.hardware.protocol import DrainableClosure, ResourceClass, WaitingTask

GUARANTEED = ResourceClass.GUARANTEED

# pressure never fires (allocation cannot exceed 100%): only the waiting tasks make drains
POLICY = SelectionPolicy(under_use_util_pct=20, under_use_minutes=5, pressure_util_pct=100, min_score=0.4)
LIMITS = DrainLimits(
    tenant_max_drains_per_day=4,
    landing_cooldown_minutes=15,
    budgets=(BudgetRule(percent=100),),
    decision_ttl_seconds=900,
)


def waiting(task_id="rigid-1", num_gpu=2, gpu_milli=1000, waited_s=240, model="A100-80GB") -> WaitingTask:
    return WaitingTask(
        task_id=task_id,
        tenant_id="rigid",
        gpu_model=model,
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        mem_mib=0,
        waiting_since=T0 - timedelta(seconds=waited_s),
    )


def plan(tasks, nodes, wait, ledger=None, policy=POLICY, limits=LIMITS):
    inputs = PlanningInputs(
        fleet_now=T0,
        tasks=tasks,
        nodes=nodes,
        samples=samples_for({}),
        ledger=ledger or DrainLedger(),
        shadow=False,
        waiting=wait,
    )
    return plan_drains(inputs, policy, limits)


def full(node_id, *sizes, tenant="t1", **kw):
    """Tasks filling a 4-GPU node, one per size (GPUs)."""
    return [
        make_task(f"{node_id}-{i}", node=node_id, gpus=g, tenant=tenant, **kw) for i, g in enumerate(sizes)
    ]


def test_it_drains_the_tasks_in_the_way_on_the_cheapest_node() -> None:
    # n1: a 2-GPU and two 1-GPU tasks (two GPUs: drain one 2-GPU task); n2: one 4-GPU task
    tasks = full("n1", 2, 1, 1) + full("n2", 4)
    decisions = plan(tasks, [node("n1", gpus=4), node("n2", gpus=4)], [waiting(num_gpu=2)])
    assert [(d.task.task_id, d.reason, d.allowed) for d in decisions] == [
        ("n1-0", DrainReason.PRESSURE, True)
    ]
    assert decisions[0].task.node_id == "n1"
    assert (
        "guaranteed task rigid-1 waits 240 s for 2x1000 A100-80GB: room on node n1" in decisions[0].reasons[0]
    )


def test_every_task_on_the_slots_it_needs_is_drained() -> None:
    tasks = full("n2", 1, 1, 1, 1)
    decisions = plan(tasks, [node("n2", gpus=4)], [waiting(num_gpu=3)])
    assert sorted(d.task.task_id for d in decisions) == ["n2-0", "n2-1", "n2-2"]
    assert all(d.allowed and d.task.node_id == "n2" for d in decisions)


def test_a_fractional_request_drains_the_share_it_needs() -> None:
    quarter = [make_task(f"q{i}", node="n1", gpus=1, gpu_milli=250) for i in range(4)]
    for i, task in enumerate(quarter):  # four quarters on one GPU
        quarter[i] = task.__class__(**{**task.__dict__, "gpu_uuids": ("n1-gpu0",)})
    decisions = plan(quarter, [node("n1", gpus=1)], [waiting(num_gpu=1, gpu_milli=500)])
    assert len(decisions) == 2 and all(d.allowed for d in decisions)


def test_no_drain_where_the_room_is_free_already() -> None:
    tasks = full("n1", 1, 1)  # two of four GPUs free
    assert plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=2)]) == []


def test_no_drain_for_a_request_no_node_can_hold() -> None:
    tasks = full("n1", 4)
    assert plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=8)]) == []
    assert plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=2, model="H100")]) == []


def test_no_partial_drain_when_a_victim_is_protected() -> None:
    tasks = [
        make_task("free-to-go", node="n1", gpus=2),
        make_task("protected", node="n1", gpus=2, do_not_drain=True),
    ]
    assert plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=4)]) == []


def test_guaranteed_work_is_never_drained_for_it() -> None:
    tasks = [
        make_task("elastic", node="n1", gpus=2),
        make_task("rigid-0", node="n1", gpus=2, resource_class=GUARANTEED),
    ]
    assert plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=4)]) == []


def test_no_partial_drain_when_the_tenant_cap_would_be_passed() -> None:
    # tenant t1 has 3 drains today, cap 4: one more is allowed, the two this room needs are not
    ledger = DrainLedger(
        [
            LedgerEntry(f"d{i}", f"old{i}", "t1", "p1", "n9", T0 - timedelta(hours=2), "drained")
            for i in range(3)
        ]
    )
    tasks = full("n1", 2, 2)
    assert plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=4)], ledger) == []
    # the same room where the cap still has two drains left
    assert len(plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=4)], DrainLedger(ledger.entries[:2]))) == 2


def test_a_blocked_node_gives_way_to_the_next_cheapest() -> None:
    # n1 is cheaper (one 2-GPU task) but its tenant's cap is used up; n2 needs two tasks drained
    ledger = DrainLedger(
        [
            LedgerEntry(f"d{i}", f"old{i}", "capped", "p1", "n9", T0 - timedelta(hours=2), "drained")
            for i in range(4)
        ]
    )
    tasks = full("n1", 2, 2, tenant="capped") + full("n2", 1, 1, 1, 1)
    decisions = plan(tasks, [node("n1", gpus=4), node("n2", gpus=4)], [waiting(num_gpu=2)], ledger)
    assert {d.task.node_id for d in decisions} == {"n2"} and len(decisions) == 2
    assert all(d.allowed for d in decisions)


def test_the_oldest_waiting_task_is_served_first() -> None:
    # one node can be emptied this pass (budget: one disrupted node): the oldest task gets it
    limits = DrainLimits(4, 15, (BudgetRule(nodes=1),), 900)
    tasks = full("n1", 4) + full("n2", 4)
    wait = [waiting("young", num_gpu=4, waited_s=60), waiting("old", num_gpu=4, waited_s=600)]
    decisions = plan(tasks, [node("n1", gpus=4), node("n2", gpus=4)], wait, limits=limits)
    assert len(decisions) == 1 and decisions[0].allowed
    assert "guaranteed task old waits 600 s" in decisions[0].reasons[0]


def test_a_room_being_drained_is_not_drained_twice() -> None:
    # n1's task has an open drain (this tick's ledger): the waiting task's room is on the way
    tasks = full("n1", 4) + full("n2", 4)
    ledger = DrainLedger([LedgerEntry("d0", "n1-0", "t1", "p1", "n1", T0 - timedelta(minutes=1))])
    assert plan(tasks, [node("n1", gpus=4), node("n2", gpus=4)], [waiting(num_gpu=4)], ledger) == []


def test_waiting_tasks_come_from_a_backend_that_knows_them_and_none_from_others() -> None:
    class Bare:  # local-process, NVML: no queue, no such method
        pass

    class Twin:
        def waiting_guaranteed(self, limit: int) -> list[WaitingTask]:
            return [waiting(f"w{i}") for i in range(limit + 5)][:limit]

    assert waiting_guaranteed(Bare()) == ()
    assert len(waiting_guaranteed(Twin())) == MAX_WAITING_READ


def test_rule_4_closes_the_models_guaranteed_work_waits_on_for_a_lease_of_two_ticks() -> None:
    """A backend that starts work itself (Slurm) is told the GPU models guaranteed tasks wait
    on, a lease of two control ticks, and whether to act (not in shadow mode); a backend
    without the method (the twin applies the rule in its own placement, local-process and
    NVML have no queue), or the rule switched off, gets nothing."""

    class Queue:
        def __init__(self) -> None:
            self.calls: list[tuple[frozenset[str], float, bool]] = []

        def waiting_guaranteed(self, limit: int) -> list[WaitingTask]:
            return [
                waiting("w1", model="A100-80GB"),
                waiting("w2", model="H800"),
                waiting("w3", model="H800"),
            ]

        def close_to_drainable(self, models, lease_seconds: float, *, act: bool) -> DrainableClosure:
            self.calls.append((frozenset(models), lease_seconds, act))
            return DrainableClosure(tuple(sorted(models)))

    def config(**overrides: str) -> MarketPipelineConfig:
        return load_config(environ={f"MP__{k}": v for k, v in overrides.items()})

    queue = Queue()
    closure = close_to_drainable(queue, config(LOOP__TICK_MINUTES="5"))
    assert closure == DrainableClosure(("A100-80GB", "H800"))
    assert queue.calls == [(frozenset({"A100-80GB", "H800"}), 600.0, True)]
    close_to_drainable(queue, config(LOOP__TICK_MINUTES="2", LOOP__SHADOW_MODE="true"))
    assert queue.calls[-1] == (frozenset({"A100-80GB", "H800"}), 240.0, False)
    assert close_to_drainable(queue, config(GUARDRAILS__RIGID_GUARANTEE__CLOSE_TO_DRAINABLE="false")) is None
    assert close_to_drainable(queue, config(GUARDRAILS__RIGID_GUARANTEE__ENABLED="false")) is None
    assert len(queue.calls) == 2

    class Twin:
        def waiting_guaranteed(self, limit: int) -> list[WaitingTask]:
            return [waiting()]

    assert close_to_drainable(Twin(), config()) is None


def test_the_room_for_a_waiting_guaranteed_task_comes_before_pressure_on_a_budget_of_one_node() -> None:
    """Two full 4-GPU nodes, allocation 100%: pool pressure (threshold 92%) and a waiting
    guaranteed task both want a drain, and the budget allows one node. The waiting task's
    node gets it (its method runs first); pressure's lowest-priority-first pick, on the other
    node, is refused by the budget. Pressure first, the budget went where no room was needed
    (the default demo's twin: every room drain refused by `pool_budget`)."""
    limits = DrainLimits(
        tenant_max_drains_per_day=4,
        landing_cooldown_minutes=15,
        budgets=(BudgetRule(nodes=1),),
        decision_ttl_seconds=900,
    )
    policy = SelectionPolicy(under_use_util_pct=20, under_use_minutes=5, pressure_util_pct=92, min_score=0.4)
    # n1: the cheapest room for one GPU; n2: one 4-GPU task of the lowest priority
    tasks = full("n1", 1, 1, 1, 1, priority=5) + full("n2", 4, priority=0)
    decisions = plan(
        tasks, [node("n1", gpus=4), node("n2", gpus=4)], [waiting(num_gpu=1)], policy=policy, limits=limits
    )
    approved = [d for d in decisions if d.allowed]
    assert approved[0].task.task_id == "n1-0" and "guaranteed task rigid-1 waits" in approved[0].reasons[0]
    assert {d.task.node_id for d in decisions if d.allowed} == {"n1"}
    assert any(not d.allowed and d.task.node_id == "n2" for d in decisions)  # pressure's pick, over budget


def test_a_task_drained_for_a_waiting_task_is_not_handed_to_pressure_again() -> None:
    """One full 4-GPU node, allocation 100%: the waiting task's room and pool pressure
    (threshold 92%) both pick its one drainable task. It gets one decision, the room's, not a
    second one with the same decision id from pressure (seen on real Slurm daemons); the room
    drain does not count as relieving pressure (the waiting task takes the room)."""
    policy = SelectionPolicy(under_use_util_pct=20, under_use_minutes=5, pressure_util_pct=92, min_score=0.4)
    decisions = plan(full("n1", 4), [node("n1", gpus=4)], [waiting(num_gpu=1)], policy=policy)
    assert [(d.task.task_id, d.allowed) for d in decisions] == [("n1-0", True)]
    assert "guaranteed task rigid-1 waits" in decisions[0].reasons[0]
    # with a second drainable task there, pressure still wants it: the room frees nothing for it
    tasks = full("n1", 2, 2)
    decisions = plan(tasks, [node("n1", gpus=4)], [waiting(num_gpu=2)], policy=policy)
    assert len({d.decision_id for d in decisions}) == len(decisions) == 2
    assert [d.reasons[0].split(":")[1].strip().split()[0] for d in decisions] == ["guaranteed", "pool"]


def test_a_task_churn_may_still_serve_is_drained_for_only_when_a_later_pass_would_be_late() -> None:
    """With `drain_at_latest_step` (the shipped config: 600 s SLA wait, 120 s drains, 5-minute
    passes, so 180 s), a 2-GPU task on 4-GPU nodes that has waited 60 s is left to the pool's
    churn this pass; at 240 s it is drained for. A 4-GPU task (a whole node) is drained for at
    once: churn rarely empties a node."""
    from market_pipeline.config import load_config

    policy = SelectionPolicy.from_config(load_config())
    assert policy.guaranteed_drain_after_seconds == 180.0
    policy = dataclasses.replace(policy, pressure_util_pct=100)  # only the waiting tasks drain
    tasks = full("n1", 2, 1, 1) + full("n2", 4)
    nodes = [node("n1", gpus=4), node("n2", gpus=4)]
    assert plan(tasks, nodes, [waiting(num_gpu=2, waited_s=60)], policy=policy) == []
    assert [
        d.task.task_id for d in plan(tasks, nodes, [waiting(num_gpu=2, waited_s=240)], policy=policy)
    ] == ["n1-0"]
    whole = plan(tasks, nodes, [waiting(num_gpu=4, waited_s=10)], policy=policy)
    assert sum(d.task.gpus for d in whole) == 4 and all(d.allowed for d in whole)


def test_draining_at_the_first_pass_is_a_setting() -> None:
    from market_pipeline.config import load_config

    config = load_config()
    guarantee = config.guardrails.rigid_guarantee.model_copy(update={"drain_at_latest_step": False})
    config = config.model_copy(
        update={"guardrails": config.guardrails.model_copy(update={"rigid_guarantee": guarantee})}
    )
    assert SelectionPolicy.from_config(config).guaranteed_drain_after_seconds == 0.0


def _late_drains(mode: str) -> SelectionPolicy:
    from market_pipeline.config import load_config

    config = load_config()
    guarantee = config.guardrails.rigid_guarantee.model_copy(update={"late_drains": mode})
    config = config.model_copy(
        update={"guardrails": config.guardrails.model_copy(update={"rigid_guarantee": guarantee})}
    )
    return dataclasses.replace(SelectionPolicy.from_config(config), pressure_util_pct=100)


def test_a_task_still_in_time_gets_the_one_room_before_tasks_already_late() -> None:
    """Budget for one node; one waiting task late by an hour, one that a drain now still starts
    within its SLA wait (600 s less a 120 s drain: in time up to 480 s of waiting). With
    `after_in_time` the room goes to the one still in time; with `never` the late one gets
    none even where room is left; `oldest_first` keeps the oldest first."""
    limits = DrainLimits(4, 15, (BudgetRule(nodes=1),), 900)
    tasks = full("n1", 4) + full("n2", 4)
    nodes = [node("n1", gpus=4), node("n2", gpus=4)]
    wait = [waiting("late", num_gpu=4, waited_s=3600), waiting("in-time", num_gpu=4, waited_s=300)]

    def served(mode: str, budget: DrainLimits = limits) -> list[str]:
        decisions = plan(tasks, nodes, wait, policy=_late_drains(mode), limits=budget)
        return [d.reasons[0].split()[3] for d in decisions if d.allowed]

    assert served("after_in_time") == ["in-time"]
    assert served("oldest_first") == ["late"]
    assert served("never", LIMITS) == ["in-time"]  # room for both, none drained for the late one
    assert sorted(served("after_in_time", LIMITS)) == ["in-time", "late"]


def test_the_fleet_is_read_far_enough_to_see_tasks_in_time_behind_a_late_backlog() -> None:
    """100 late tasks and one in time: the planner sees it (the read is not cut at the 64 a
    pass plans for) and, with `after_in_time`, plans for it first."""

    class Twin:
        def waiting_guaranteed(self, limit: int) -> list[WaitingTask]:
            late = [waiting(f"late-{i:03d}", num_gpu=4, waited_s=7200 - i) for i in range(100)]
            return (late + [waiting("in-time", num_gpu=4, waited_s=300)])[:limit]

    wait = list(waiting_guaranteed(Twin()))
    assert wait[-1].task_id == "in-time"
    limits = DrainLimits(4, 15, (BudgetRule(nodes=1),), 900)
    tasks = full("n1", 4) + full("n2", 4)
    decisions = plan(
        tasks,
        [node("n1", gpus=4), node("n2", gpus=4)],
        wait,
        policy=_late_drains("after_in_time"),
        limits=limits,
    )
    assert [d.reasons[0].split()[3] for d in decisions if d.allowed] == ["in-time"]
