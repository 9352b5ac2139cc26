"""plan_pool never flaps a node: at most `max_cordons_per_day` cordons a node a day.

The regression: in `make demo` (hourly ticks) the task-drain guardrail refused to drain the
tasks of a10-hz-a-06 (its tenant's daily drain cap was spent). The scaler's drain timed out
after 30 minutes, the node was uncordoned, its 30-minute cool-down had passed by the next
tick, and the scaler cordoned it again: 4 cordons and uncordons in one simulated day.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import polars as pl
from scaling_testkit import T0, policy_config

from market_pipeline.decision_checks.flapping import flapping_verdict
from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import DrainStatus, NodeState, NodeView, PoolState, ScalerMemory

CONFIG = policy_config(
    hysteresis_minutes=15.0,
    scale_up_cooldown_minutes=0.0,
    disruption_budget_pct=50.0,
    failed_scale_down_cooldown_minutes=30.0,
    drain_timeout_minutes=30.0,
    max_drain_attempts=3,
    replacement_cost_per_node=0.5,
    failed_drains_to_pause_pool=10,
)


def run_day(
    tick_minutes: int, protected: frozenset[str] = frozenset(), memory: ScalerMemory | None = None
) -> tuple[list, ScalerMemory]:
    """A day of ticks on 6 nodes running 2 GPUs each while 12 GPUs of demand need 2 nodes:
    the scaler wants 4 gone, and the drain guardrail never moves a task (a spent tenant cap,
    or a protected task where the status says so)."""
    memory = memory or ScalerMemory("pool")
    cordoned: set[str] = set()
    state = PoolState("pool", node_gpus=8, max_nodes=20, demand_gpus=12.0, gpu_hour_cost=1.2)
    decisions = []
    for minute in range(0, 24 * 60, tick_minutes):
        nodes = [
            NodeView(
                f"n{i}",
                NodeState.CORDONED if f"n{i}" in cordoned else NodeState.ACTIVE,
                8,
                2.0,
                task_gpus=(2.0,),
            )
            for i in range(6)
        ]
        drains = {
            n.node_id: DrainStatus(
                n.node_id,
                False,
                blocked=n.node_id in protected,
                reason="do-not-drain task" if n.node_id in protected else "",
            )
            for n in nodes
        }
        now = T0 + dt.timedelta(minutes=minute)
        tick = plan_pool(state, 12.0, 1.0, nodes, drains, CONFIG, now, memory=memory)
        for d in tick:
            if d.allowed and d.action == "cordon":
                cordoned.add(d.node_id)
            elif d.allowed and d.action == "uncordon":
                cordoned.discard(d.node_id)
        decisions += [(now, d) for d in tick]
    return decisions, memory


def per_node(decisions, action: str) -> Counter:
    return Counter(d.node_id for _, d in decisions if d.allowed and d.action == action)


def test_a_drain_that_never_completes_does_not_cycle_its_node_on_hourly_ticks() -> None:
    decisions, memory = run_day(60)
    cordons, uncordons = per_node(decisions, "cordon"), per_node(decisions, "uncordon")
    assert cordons and max(cordons.values()) == CONFIG.max_cordons_per_day  # tried, then left alone
    assert max(uncordons.values()) <= CONFIG.max_cordons_per_day
    skipped = [r for _, d in decisions for r in d.reasons if r.startswith("flap_guard")]
    assert skipped  # the operator reads why a surplus node stays
    # the memory survives its JSON round trip (the live loop stores it between ticks)
    restored = ScalerMemory.from_dict(json.loads(json.dumps(memory.to_dict())))
    assert restored.cordons == memory.cordons


def test_the_no_flapping_check_passes_on_the_policys_own_day() -> None:
    for tick_minutes in (5, 60):
        decisions, _ = run_day(tick_minutes)
        rows = pl.DataFrame(
            [
                {"target": d.node_id, "action": d.action, "decided_at": now, "outcome": None}
                for now, d in decisions
                if d.allowed and d.action in ("cordon", "uncordon")
            ],
            schema={
                "target": pl.Utf8,
                "action": pl.Utf8,
                "decided_at": pl.Datetime("us", "UTC"),
                "outcome": pl.Utf8,
            },
        )
        for start in range(0, rows.height):  # every 24-hour window the check could see
            window = rows.filter(
                pl.col("decided_at").is_between(
                    rows["decided_at"][start], rows["decided_at"][start] + dt.timedelta(hours=24)
                )
            )
            assert flapping_verdict(window).passed, (tick_minutes, flapping_verdict(window).description)


def test_a_node_whose_task_is_protected_is_not_cordoned_at_all() -> None:
    decisions, _ = run_day(60, protected=frozenset({"n0", "n1"}))
    cordons = per_node(decisions, "cordon")
    assert "n0" not in cordons and "n1" not in cordons
    assert cordons  # the other nodes stand in
