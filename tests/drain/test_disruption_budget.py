"""The one disruption budget: the scaler's and the drain planner's methods consume from it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from drain_testkit import T0, make_task, node, samples_for

from market_pipeline.disruption.budget import (
    BudgetRule,
    DisruptionBudget,
    DisruptionReason,
    PoolBudget,
    run_methods,
)
from market_pipeline.drain.limits import DrainLedger, DrainLimits
from market_pipeline.drain.plan import PlanningInputs, SelectionPolicy, plan_drains
from market_pipeline.drain.triggers import DRAIN_METHODS
from market_pipeline.scaling.disruption import SCALER_METHODS
from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import (
    NodeState,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingReason,
)
from market_pipeline.tick.certificate import BacklogParams

POLICY = SelectionPolicy(
    under_use_util_pct=20,
    under_use_minutes=5,
    pressure_util_pct=92,
    min_score=0.4,
    sample_interval_seconds=60,
    tick_minutes=5,
)
LIMITS = DrainLimits(
    tenant_max_drains_per_day=4,
    landing_cooldown_minutes=15.0,
    budgets=(BudgetRule(percent=20.0),),
    decision_ttl_seconds=900,
)
SCALING = ScalingConfig(
    backlog=BacklogParams(residual_share=0.2, elasticity=1.0, price_min=0.5, price_max=3.0),
    keep_window_hours=0.0,
    drainable_floor_window_hours=0.0,
    scale_up_persistence_minutes=0.0,
    urgent_persistence_minutes=0.0,
    min_scale_down_fraction=0.0,
    warm_pool_nodes=0,
    interval_minutes=5.0,
    hysteresis_minutes=10.0,
    scale_up_cooldown_minutes=0.0,
    max_removals_per_hour=10,
    disruption_budget_pct=20.0,
    replacement_cost_per_node=0.5,
)
NODES = [f"n{i}" for i in range(10)]


def scale_down_tick(budget: DisruptionBudget | None) -> list:
    """Ten busy nodes, demand for two: the tick after the hysteresis, so every surplus node is ripe."""
    views = [NodeView(n, NodeState.ACTIVE, 8, 1.0, (1.0,)) for n in NODES]
    state = PoolState("p1", node_gpus=8, max_nodes=10, demand_gpus=10.0, gpu_hour_cost=1.2)
    memory = ScalerMemory("p1")
    plan_pool(state, 10.0, 1.0, views, {}, SCALING, T0, memory=memory)
    return plan_pool(
        state, 10.0, 1.0, views, {}, SCALING, T0 + timedelta(minutes=20), memory=memory, budget=budget
    )


def drains_after(cordoned: list[str], budget: DisruptionBudget | None, idle: list[str] = NODES) -> list:
    """One task on every node, under-used on the `idle` nodes; the scaler's nodes are to be emptied."""
    tasks = [make_task(f"t-{n}", node=n, tenant=f"ten-{n}") for n in NODES]
    util = {t.task_id: 1 if t.node_id in idle else 100 for t in tasks}
    inputs = PlanningInputs(
        fleet_now=T0,
        tasks=tasks,
        nodes=[node(n) for n in NODES],
        samples=samples_for(util),
        ledger=DrainLedger(),
        shadow=False,
        scale_down_nodes=tuple(cordoned),
    )
    return plan_drains(inputs, POLICY, LIMITS, budget)


def disrupted(scaling: list, drains: list) -> set[str]:
    cordoned = {d.node_id for d in scaling if d.action == "cordon" and d.allowed}
    return cordoned | {d.task.node_id for d in drains if d.allowed}


def test_a_scale_down_and_drains_in_one_tick_cannot_together_exceed_the_budget() -> None:
    budget = DisruptionBudget(LIMITS.budgets, T0, {"p1": len(NODES)})  # 20% of 10 nodes: 2
    scaling = scale_down_tick(budget)
    cordoned = [d.node_id for d in scaling if d.action == "cordon" and d.allowed]
    assert len(cordoned) == 2  # the scaler took the whole budget...
    assert any(ScalingReason.DISRUPTION_BUDGET in d.codes for d in scaling)  # ...and was stopped by it
    drains = drains_after(cordoned, budget)
    assert disrupted(scaling, drains) == set(cordoned)  # the drains only empty the scaler's nodes
    refused = [d for d in drains if not d.allowed and d.task.node_id not in cordoned]
    assert len(refused) == len(NODES) - 2
    assert all(any(r.startswith("pool_budget: p1 allows 2 of 10") for r in d.reasons) for d in refused)


@pytest.mark.parametrize("shared", [True, False])
def test_drains_first_leave_the_scaler_what_is_left_of_the_budget(shared: bool) -> None:
    """Drains on two nodes, then the scaler: with one budget it may only take those two nodes
    (already disrupted: they cost nothing more); with a budget each (the two engines before)
    the tick disrupted twice the budget."""
    budget = DisruptionBudget(LIMITS.budgets, T0, {"p1": len(NODES)}) if shared else None
    drains = drains_after([], budget, idle=["n8", "n9"])
    assert {d.task.node_id for d in drains if d.allowed} == {"n8", "n9"}
    scaling = scale_down_tick(budget)
    assert len(disrupted(scaling, drains)) == (2 if shared else 4)


def test_methods_run_in_order_each_consuming_from_the_same_budget() -> None:
    seen: list[tuple[str, int]] = []

    @dataclasses.dataclass(frozen=True)
    class Takes:
        node_id: str
        reason: DisruptionReason = DisruptionReason.PRESSURE

        def compute(self, plan: list, budget: DisruptionBudget) -> None:
            pool = budget.pool("p1")
            if pool.allows(self.reason, self.node_id):
                pool.consume(self.node_id)
            plan.append((self.node_id, len(pool.disrupting)))

    budget = DisruptionBudget((BudgetRule(nodes=2),), T0, {"p1": 10})
    run_methods([Takes("a"), Takes("a"), Takes("b"), Takes("c")], seen, budget)
    assert seen == [("a", 1), ("a", 1), ("b", 2), ("c", 2)]  # a node already disrupting is free; c is over
    assert [type(m).__name__ for m in DRAIN_METHODS[:2]] == ["GuaranteedWaiting", "Pressure"]
    assert [m.reason for m in DRAIN_METHODS] == [
        DisruptionReason.PRESSURE,  # room for waiting guaranteed tasks: the simulator's reason
        DisruptionReason.PRESSURE,
        DisruptionReason.MANUAL,
        DisruptionReason.BUDGET,
        DisruptionReason.SCALE_DOWN,
        DisruptionReason.UNDER_USED,
    ]
    assert [m.reason for m in SCALER_METHODS] == [DisruptionReason.SCALE_DOWN, DisruptionReason.NODE_HEALTH]


def test_a_pressure_drain_uses_the_budget_an_under_used_drain_then_lacks() -> None:
    # 17 of 17 GPUs allocated: pressure frees one 8-GPU task (low priority first); the idle
    # task on a third node is under-used, but the one node the budget allows is taken
    tasks = [
        make_task("big", node="n0", tenant="a", gpus=8),
        make_task("fill", node="n1", tenant="b", gpus=8),
        make_task("idle", node="n2", tenant="c", priority=10),
    ]
    inputs = PlanningInputs(
        fleet_now=T0,
        tasks=tasks,
        nodes=[node("n0"), node("n1"), node("n2", gpus=1)],
        samples=samples_for({"big": 100, "fill": 100, "idle": 1}),
        ledger=DrainLedger(),
        shadow=False,
    )
    decisions = plan_drains(inputs, POLICY, dataclasses.replace(LIMITS, budgets=(BudgetRule(nodes=1),)))
    assert [(d.reason, d.allowed) for d in decisions] == [
        (DisruptionReason.PRESSURE, True),
        (DisruptionReason.UNDER_USED, False),
    ]
    assert decisions[1].task.task_id == "idle"
    assert (
        decisions[1].reasons[-1].startswith("pool_budget: p1 allows 1 of 3 node(s) disrupted for under_used")
    )


def test_busy_cordoned_nodes_count_as_disrupting() -> None:
    nodes = [dataclasses.replace(node("n0"), cordoned=True), node("n1"), node("n2")]
    tasks = [make_task("on-cordoned", node="n0"), make_task("elsewhere", node="n1", tenant="t2")]
    budget = LIMITS.tick_budget(nodes, tasks, DrainLedger(), T0)
    assert budget.pool("p1").disrupting == {"n0"}
    assert not budget.pool("p1").allows(DisruptionReason.UNDER_USED, "n1")  # 20% of 3 nodes: 1
    empty = LIMITS.tick_budget(nodes, tasks[1:], DrainLedger(), T0)
    assert empty.pool("p1").disrupting == set()  # an empty cordoned node disrupts nothing


@pytest.mark.parametrize(
    ("rules", "reason", "cap"),
    [
        ((BudgetRule(percent=10.0),), DisruptionReason.SCALE_DOWN, 1),
        (
            (BudgetRule(percent=10.0), BudgetRule(nodes=0, reasons=frozenset({DisruptionReason.UNDER_USED}))),
            DisruptionReason.UNDER_USED,
            0,
        ),
        (
            (BudgetRule(nodes=0, reasons=frozenset({DisruptionReason.UNDER_USED})),),
            DisruptionReason.PRESSURE,
            None,
        ),
    ],
)
def test_the_most_restrictive_rule_for_the_reason_caps_it(rules, reason, cap) -> None:
    pool = PoolBudget("p1", 5, rules, T0)
    assert pool.cap(reason) == cap
    assert pool.allows(reason, "n1") == (cap is None or cap >= 1)


def test_a_cap_below_the_nodes_already_disrupting_blocks_them_too() -> None:
    pool = PoolBudget("p1", 10, (BudgetRule(nodes=1),), T0, {"n1", "n2"})
    assert not pool.allows(DisruptionReason.PRESSURE, "n1")
    assert pool.blocker(DisruptionReason.PRESSURE, "n1") == (
        "pool_budget: p1 allows 1 of 10 node(s) disrupted for pressure, 2 busy"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"nodes": "1", "colour": "red"}, "budgets.0: unknown key(s) ['colour']"),
        ({"nodes": "lots"}, "budgets.0.nodes: expected a count or 'N%', got 'lots'"),
        ({}, "budgets.0.nodes: expected a count or 'N%', got ''"),
        ({"nodes": "-1"}, "budgets.0: budget.nodes must be >= 0, got -1"),
        ({"nodes": "101%"}, "budgets.0: budget.percent must be in 0..100, got 101.0"),
        ({"nodes": "-0.5%"}, "budgets.0: budget.percent must be in 0..100, got -0.5"),
        (
            {"nodes": "1", "schedule": "0 9 * * *"},
            "budgets.0: budget: schedule and duration_minutes go together",
        ),
        (
            {"nodes": "1", "duration_minutes": 5},
            "budgets.0: budget: schedule and duration_minutes go together",
        ),
        (
            {"nodes": "1", "schedule": "at nine", "duration_minutes": 5},
            "budgets.0: budget.schedule 'at nine' is not a cron expression",
        ),
        (
            {"nodes": "1", "schedule": "0 9 * * *", "duration_minutes": 0},
            "budgets.0: budget.duration_minutes must be > 0",
        ),
    ],
)
def test_a_budget_rule_that_cannot_be_kept_is_refused_naming_the_field(raw, message) -> None:
    from market_pipeline.disruption.budget import BudgetRuleError, parse_rules

    with pytest.raises(BudgetRuleError) as refused:
        parse_rules([{"nodes": "2"}, raw][1:], "budgets")
    assert str(refused.value) == message
    with pytest.raises(BudgetRuleError, match="^budget: give exactly one of nodes or percent$"):
        BudgetRule(nodes=1, percent=10.0)


def test_budget_rules_at_their_edges() -> None:
    from market_pipeline.disruption.budget import parse_rules

    zero, full, everyone = parse_rules([{"nodes": "0"}, {"nodes": "100%"}, {"nodes": "0%"}])
    assert (zero.nodes, full.percent, everyone.percent) == (0, 100.0, 0.0)
    assert [BudgetRule(percent=p).allowed_nodes(10) for p in (0.0, 10.0, 10.01, 25.0, 100.0)] == [
        0,
        1,
        2,
        3,
        10,
    ]
    assert BudgetRule(percent=20.0).allowed_nodes(3) == 1  # 0.6 rounds up to one node
    window = BudgetRule.parse(
        {"nodes": "0", "reasons": ["under_used", "pressure"], "schedule": "0 9 * * *", "duration_minutes": 60}
    )
    nine = T0.replace(hour=9, minute=0, second=0, microsecond=0)
    assert window.active(nine) and window.active(nine + timedelta(minutes=59, seconds=59))
    assert not window.active(nine + timedelta(minutes=60))  # the window is [09:00, 10:00)
    assert not window.active(nine - timedelta(seconds=1))
    assert window.applies_to(DisruptionReason.PRESSURE) and not window.applies_to(DisruptionReason.SCALE_DOWN)
    assert BudgetRule(nodes=2).applies_to(DisruptionReason.SCALE_DOWN) and BudgetRule(nodes=2).active(nine)
    half_minute = BudgetRule(nodes=0, schedule="0 9 * * *", duration_minutes=0.5)  # any positive length
    assert half_minute.active(nine) and not half_minute.active(nine + timedelta(seconds=30))


def test_an_unknown_pool_has_no_nodes_and_nothing_disrupting() -> None:
    budget = DisruptionBudget((BudgetRule(percent=50.0),), T0, {"p1": 4}, {"p1": ["n1"]})
    p1, other = budget.pool("p1"), budget.pool("p9")
    assert (p1.pool_nodes, p1.disrupting) == (4, {"n1"}) and budget.pool("p1") is p1
    assert (other.pool_nodes, other.disrupting, other.cap(DisruptionReason.MANUAL)) == (0, set(), 0)
    assert p1.allows(DisruptionReason.MANUAL, "n1") and p1.allows(DisruptionReason.MANUAL, "n2")
    p1.consume("n2")
    assert p1.blocker(DisruptionReason.MANUAL, "n3") == (
        "pool_budget: p1 allows 2 of 4 node(s) disrupted for manual, 2 busy"
    )
    assert p1.blocker(DisruptionReason.MANUAL, "n2") is None  # already disrupting: adds nothing


def test_a_scheduled_rule_for_one_reason_blocks_only_that_reason_inside_its_window() -> None:
    """No under-used drains 09:00-17:00 on weekdays (Monday 2026-03-02), a quarter of the pool
    for anything else: the tick's budget applies each at the tick's own time."""
    rules = (
        BudgetRule(percent=25.0),
        BudgetRule.parse(
            {"nodes": "0", "reasons": ["under_used"], "schedule": "0 9 * * 1-5", "duration_minutes": 480}
        ),
    )
    monday = T0.replace(hour=9, minute=0, second=0, microsecond=0)
    inside = DisruptionBudget(rules, monday + timedelta(hours=3), {"p1": 8}).pool("p1")
    assert inside.blocker(DisruptionReason.UNDER_USED, "n1") == (
        "pool_budget: p1 allows 0 of 8 node(s) disrupted for under_used, 0 busy"
    )
    assert (
        inside.blocker(DisruptionReason.PRESSURE, "n1") is None and inside.cap(DisruptionReason.PRESSURE) == 2
    )
    after = DisruptionBudget(rules, monday + timedelta(hours=8), {"p1": 8}).pool("p1")
    assert (
        after.cap(DisruptionReason.UNDER_USED) == 2
        and after.blocker(DisruptionReason.UNDER_USED, "n1") is None
    )


def test_a_rule_refused_without_a_place_names_the_budget() -> None:
    from market_pipeline.disruption.budget import BudgetRuleError, parse_rules

    with pytest.raises(BudgetRuleError, match=r"^budget\.nodes: expected a count or 'N%', got 'x'$"):
        BudgetRule.parse({"nodes": "x"})
    with pytest.raises(BudgetRuleError, match=r"^budgets\.1\.nodes: expected a count or 'N%', got 'x'$"):
        parse_rules([{"nodes": "1"}, {"nodes": "x"}])
