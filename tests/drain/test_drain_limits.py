"""Drainability score, candidate selection, caps, budgets, cron windows, cool-downs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl
import pytest
from drain_testkit import T0, make_task, node, samples_for

from market_pipeline.config import load_config
from market_pipeline.disruption.budget import BudgetRule, BudgetRuleError
from market_pipeline.drain.limits import (
    DrainLedger,
    DrainLimits,
    DrainReason,
    LedgerEntry,
)
from market_pipeline.drain.plan import (
    PlanningInputs,
    SelectionPolicy,
    decision_id_for,
    node_is_drained,
    plan_drains,
)
from market_pipeline.drain.score import (
    DrainHistory,
    drainability_score,
    is_under_used,
    task_utilisation,
)
from market_pipeline.hardware.protocol import ResourceClass, TaskKind

POLICY = SelectionPolicy(
    under_use_util_pct=20,
    under_use_minutes=5,
    pressure_util_pct=92,
    min_score=0.4,
    sample_interval_seconds=60,
    tick_minutes=5,
)


def limits(cap=4, budget_pct=100.0, cooldown=15.0, extra=()):
    return DrainLimits(
        tenant_max_drains_per_day=cap,
        landing_cooldown_minutes=cooldown,
        budgets=(BudgetRule(percent=budget_pct), *extra),
        decision_ttl_seconds=900,
    )


def inputs(tasks, nodes=None, samples=None, ledger=None, **kw) -> PlanningInputs:
    return PlanningInputs(
        fleet_now=T0,
        tasks=tasks,
        nodes=nodes or [node("n1"), node("n2")],
        samples=samples if samples is not None else samples_for({}),
        ledger=ledger or DrainLedger(),
        shadow=False,
        **kw,
    )


def test_drain_score_prefers_responsive_checkpointing_idle_drainable_tasks():
    idle = task_utilisation(samples_for({"a": 2.0}), [make_task("a")], T0, 5)["a"]
    good = drainability_score(make_task("a"), idle, DrainHistory(answered=5))
    stubborn = drainability_score(make_task("a"), idle, DrainHistory(ignored=5))
    no_ckpt = drainability_score(make_task("a", checkpointable=False), idle, None)
    guaranteed = drainability_score(make_task("a", resource_class=ResourceClass.GUARANTEED), idle, None)
    inference = drainability_score(make_task("a", kind=TaskKind.INFERENCE, checkpointable=False), idle, None)
    assert good.score > stubborn.score
    assert drainability_score(make_task("a"), idle, None).score > no_ckpt.score
    assert drainability_score(make_task("a"), idle, None).score > guaranteed.score
    assert inference.score > no_ckpt.score
    assert 0.0 <= stubborn.score <= good.score <= 1.0


def test_drain_utilisation_is_relative_to_the_request():
    # A quarter-GPU task at 4% whole-GPU SM is using 16% of what it asked for.
    stats = task_utilisation(samples_for({"q": 4.0}), [make_task("q", gpu_milli=250)], T0, 5)
    assert stats["q"].mean_pct == pytest.approx(16.0)
    assert is_under_used(stats["q"], 20, 5, 60)
    short = task_utilisation(samples_for({"q": 4.0}, minutes=1), [make_task("q")], T0, 5)
    assert not is_under_used(short["q"], 20, 5, 60)  # one minute is not "for 5 minutes"
    with pytest.raises(ValueError, match="sm_util_pct"):
        task_utilisation(pl.DataFrame({"ts": [T0], "task_id": ["q"]}), [make_task("q")], T0, 5)


def test_drain_under_used_candidates_and_do_not_drain():
    tasks = [make_task("idle"), make_task("busy"), make_task("vip", do_not_drain=True)]
    decisions = plan_drains(
        inputs(tasks, samples=samples_for({"idle": 3, "busy": 80, "vip": 1})), POLICY, limits()
    )
    by_task = {d.task.task_id: d for d in decisions}
    assert set(by_task) == {"idle", "vip"}
    assert by_task["idle"].allowed and by_task["idle"].reason is DrainReason.UNDER_USED
    assert not by_task["vip"].allowed
    assert any(r.startswith("do_not_drain") for r in by_task["vip"].reasons)


def test_drain_landing_cooldown_blocks_fresh_tasks():
    fresh = make_task("fresh", started_at=T0 - timedelta(minutes=3))
    [decision] = plan_drains(inputs([fresh], samples=samples_for({"fresh": 1})), POLICY, limits(cooldown=15))
    assert not decision.allowed
    assert any(r.startswith("landing_cooldown") for r in decision.reasons)


def test_drain_tenant_cap_counts_recent_drains_only():
    ledger = DrainLedger(
        [
            LedgerEntry("old", "x", "t1", "p1", "n9", T0 - timedelta(hours=30), "terminated"),
            LedgerEntry("recent", "y", "t1", "p1", "n9", T0 - timedelta(hours=2), "killed"),
            LedgerEntry("aborted", "z", "t1", "p1", "n9", T0 - timedelta(hours=1), "aborted"),
        ]
    )
    tasks = [make_task("a", node="n1"), make_task("b", node="n2")]
    decisions = plan_drains(
        inputs(tasks, samples=samples_for({"a": 1, "b": 1}), ledger=ledger), POLICY, limits(cap=2)
    )
    assert [d.allowed for d in decisions] == [True, False]
    assert any(r.startswith("tenant_cap") for r in decisions[1].reasons)


def test_drain_pool_budget_counts_nodes_and_rounds_percent_up():
    nodes = [node(f"n{i}") for i in range(6)]
    tasks = [make_task(f"t{i}", node=f"n{i}", tenant=f"ten{i}") for i in range(3)]
    tasks.append(make_task("same-node", node="n0", tenant="ten9"))
    decisions = plan_drains(
        inputs(tasks, nodes=nodes, samples=samples_for({t.task_id: 1 for t in tasks})),
        POLICY,
        limits(budget_pct=10),
    )  # ceil(0.6) = 1 node
    allowed = {d.task.task_id for d in decisions if d.allowed}
    assert allowed == {"same-node", "t0"}  # both on n0: one node disrupted
    blocked = [d for d in decisions if not d.allowed]
    assert all(any(r.startswith("pool_budget") for r in d.reasons) for d in blocked)


def test_drain_budget_by_reason_and_cron_window():
    monday_10 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)  # a Monday
    business = BudgetRule.parse(
        {"nodes": "0", "reasons": ["under_used"], "schedule": "0 9 * * 1-5", "duration_minutes": 480}
    )
    assert business.active(monday_10)
    assert not business.active(monday_10 + timedelta(hours=8))
    assert not business.active(datetime(2026, 3, 7, 10, 0, tzinfo=timezone.utc))  # Saturday
    lim = limits(extra=(business,))
    assert lim.pool_allowance(DrainReason.UNDER_USED, 10, monday_10) == 0
    assert lim.pool_allowance(DrainReason.PRESSURE, 10, monday_10) == 10
    assert lim.pool_allowance(DrainReason.UNDER_USED, 10, monday_10 + timedelta(hours=9)) == 10
    with pytest.raises(BudgetRuleError, match="cron"):
        BudgetRule.parse({"nodes": "1", "schedule": "every day", "duration_minutes": 5})
    with pytest.raises(BudgetRuleError, match="exactly one"):
        BudgetRule()
    with pytest.raises(BudgetRuleError, match="nodes"):
        BudgetRule.parse({"nodes": "lots"})
    with pytest.raises(BudgetRuleError, match="reasons"):
        BudgetRule.parse({"nodes": "1", "reasons": ["boredom"]})


def test_drain_pressure_frees_lowest_priority_first_until_under_threshold():
    nodes = [node("n1", gpus=4), node("n2", gpus=4)]
    tasks = [
        make_task(f"t{i}", node="n1" if i < 4 else "n2", priority=p, tenant=f"ten{i}")
        for i, p in enumerate([5, 1, 3, 9, 2, 7, 4, 8])
    ]  # 8 of 8 GPUs allocated
    decisions = plan_drains(
        inputs(tasks, nodes=nodes, samples=samples_for({t.task_id: 90 for t in tasks})), POLICY, limits()
    )
    pressure = [d for d in decisions if d.reason is DrainReason.PRESSURE]
    # 100% > 92%: one GPU frees enough; the lowest priority task goes.
    assert [(d.task.task_id, d.allowed) for d in pressure] == [("t1", True)]


def test_drain_tasks_with_an_open_drain_are_not_chosen_again():
    ledger = DrainLedger([LedgerEntry("d0", "idle", "t1", "p1", "n1", T0 - timedelta(minutes=1))])
    decisions = plan_drains(
        inputs([make_task("idle")], samples=samples_for({"idle": 1}), ledger=ledger), POLICY, limits()
    )
    assert decisions == []


def test_drain_decision_ids_are_stable_within_a_tick():
    task = make_task("a")
    first = decision_id_for(task, DrainReason.UNDER_USED, T0 + timedelta(seconds=10), 5)
    assert first == decision_id_for(task, DrainReason.UNDER_USED, T0 + timedelta(seconds=200), 5)
    assert first != decision_id_for(task, DrainReason.UNDER_USED, T0 + timedelta(minutes=6), 5)


def test_drain_node_gate_and_limits_from_config():
    assert node_is_drained("n1", [make_task("a", node="n2")]) == (True, [])
    assert node_is_drained("n1", [make_task("a", node="n1")]) == (False, ["a"])
    config = load_config()
    lim = DrainLimits.from_config(config)
    assert lim.tenant_max_drains_per_day == config.guardrails.task_drain.tenant_max_drains_per_day
    assert lim.budgets[0].percent == config.guardrails.task_drain.pool_disruption_budget_pct
    assert lim.decision_ttl_seconds >= config.guardrails.task_drain.max_total_seconds
    policy = SelectionPolicy.from_config(config)
    assert policy.pressure_util_pct == 92.0 and policy.under_use_minutes == 5.0


def test_drain_budget_drains_ignore_the_tenant_cap_but_not_pool_budgets():
    # the tenant already had its day's drains; a budget block still stops its tasks
    ledger = DrainLedger(
        [
            LedgerEntry("d1", "x", "t1", "p1", "n9", T0 - timedelta(hours=2), "terminated"),
            LedgerEntry("d2", "y", "t1", "p1", "n9", T0 - timedelta(hours=1), "terminated"),
        ]
    )
    nodes = [node(f"n{i}") for i in range(1, 5)]
    tasks = [make_task("a", node="n1"), make_task("b", node="n2")]
    blocked = {"t1": "balance 0.00 cannot cover the next interval"}
    decisions = plan_drains(
        inputs(tasks, nodes=nodes, ledger=ledger, budget_blocked_tenants=blocked),
        POLICY,
        limits(cap=2, budget_pct=25.0),
    )
    by_task = {d.task.task_id: d for d in decisions}
    assert {d.reason for d in decisions} == {DrainReason.BUDGET}
    assert not any(r.startswith("tenant_cap") for d in decisions for r in d.reasons)
    # 25% of 4 nodes: one node at a time, so one drain now and the other waits
    assert sorted(d.allowed for d in by_task.values()) == [False, True]
    assert any(r.startswith("pool_budget") for d in decisions if not d.allowed for r in d.reasons)


def test_drain_limits_against_a_trial_ledger_name_every_blocker():
    """The simulator checks each drain against its own trial ledger: every limit that stops a
    drain is named with its numbers, and each limit's edge is where the config says."""
    ledger_now = T0 + timedelta(hours=3)  # the ledger's clock, apart from the fleet's
    ledger = DrainLedger(
        [
            LedgerEntry(
                "d1", "x", "t1", "p1", "n2", ledger_now - timedelta(hours=24), "terminated"
            ),  # edge: counts
            LedgerEntry("d0", "v", "t1", "p1", "n2", ledger_now - timedelta(hours=24, seconds=1), "killed"),
            LedgerEntry(
                "d2", "y", "t1", "p1", "n3", ledger_now - timedelta(seconds=900)
            ),  # open, at the ttl edge
            LedgerEntry("d3", "z", "t2", "p2", "n7", ledger_now - timedelta(minutes=1)),  # open, another pool
            LedgerEntry(
                "d4", "w", "t1", "p1", "n4", ledger_now - timedelta(seconds=901)
            ),  # expired unstarted
        ]
    )
    lim = limits(cap=3, budget_pct=50.0, cooldown=15.0)  # 50% of 2 nodes: one at a time
    protected = make_task(
        "a", node="n1", tenant="t1", do_not_drain=True, started_at=T0 - timedelta(minutes=15)
    )
    fresh = make_task("b", node="n3", tenant="t3", started_at=T0 - timedelta(minutes=14.5))

    def blockers(task, reason=DrainReason.UNDER_USED, pool_nodes=2):
        return lim.blockers(
            task, reason, fleet_now=T0, ledger_now=ledger_now, ledger=ledger, pool_nodes=pool_nodes
        )

    assert blockers(protected) == [
        "do_not_drain: task a is protected",
        "tenant_cap: t1 had 3 drain(s) in 24 h, cap 3",
        "pool_budget: p1 allows 1 of 2 node(s) disrupted for under_used, 1 busy",
    ]
    # a tenant out of balance is drained whatever its count; the pool budget still holds
    assert blockers(protected, DrainReason.BUDGET) == [
        "do_not_drain: task a is protected",
        "pool_budget: p1 allows 1 of 2 node(s) disrupted for budget, 1 busy",
    ]
    assert blockers(protected, pool_nodes=4) == [  # 50% of 4: room for a second node
        "do_not_drain: task a is protected",
        "tenant_cap: t1 had 3 drain(s) in 24 h, cap 3",
    ]
    # on a node already disrupting, a drain adds nothing to the budget
    assert blockers(fresh) == ["landing_cooldown: landed 14.5 min ago < 15 min"]
    assert ledger.open_task_ids(ledger_now, 900) == {"y", "z"}


def test_drain_decisions_expire_after_three_ticks_or_a_whole_drain_and_a_tick():
    config = load_config(environ={})
    tick = config.loop.tick_minutes * 60.0
    longest = config.guardrails.task_drain.max_total_seconds
    assert DrainLimits.from_config(config).decision_ttl_seconds == max(3 * tick, longest + tick)
    slow = load_config(environ={"MP__LOOP__TICK_MINUTES": "60"})  # three hourly ticks outlast any drain
    assert DrainLimits.from_config(slow).decision_ttl_seconds == 3 * 3600.0
    quick = load_config(environ={"MP__LOOP__TICK_MINUTES": "1"})
    assert DrainLimits.from_config(quick).decision_ttl_seconds == longest + 60.0 > 180.0


def test_drain_limits_apply_a_scheduled_budget_at_the_ledgers_time():
    monday_10 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
    business = BudgetRule.parse(
        {"nodes": "0", "reasons": ["under_used"], "schedule": "0 9 * * 1-5", "duration_minutes": 480}
    )
    lim = limits(extra=(business,))
    task = make_task("a", node="n1", started_at=monday_10 - timedelta(hours=1))
    kwargs = dict(fleet_now=monday_10, ledger=DrainLedger(), pool_nodes=4)
    assert lim.blockers(task, DrainReason.UNDER_USED, ledger_now=monday_10, **kwargs) == [
        "pool_budget: p1 allows 0 of 4 node(s) disrupted for under_used, 0 busy"
    ]
    assert (
        lim.blockers(task, DrainReason.UNDER_USED, ledger_now=monday_10 + timedelta(hours=8), **kwargs) == []
    )
    budget = lim.tick_budget([node("n1"), node("n2")], [task], DrainLedger(), monday_10)
    assert (
        budget.pool("p1").cap(DrainReason.UNDER_USED) == 0
        and budget.pool("p1").cap(DrainReason.PRESSURE) == 2
    )
