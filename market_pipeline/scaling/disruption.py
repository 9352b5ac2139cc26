"""The scaler's disruption methods (`disruption.budget`): scale-down, node health.

`plan_pool` runs them in this order after its scale-up step, both consuming from the tick's
one disruption budget, the budget the task-drain planner's methods then consume from.

Scale-down removes a node only if it (a) leaves the equilibrium price certified at the lower
capacity, (b) is drained by the task-drain guardrail (an empty node needs no drain), (c) has
been unneeded for the hysteresis period, (d) saves more than its drain and replacement cost,
(e) fits the disruption budget (a node with work counts against it, an empty one does not)
and the hourly removal rate; ripe nodes are cordoned as one batch and powered off together
(`drain_gates.finish_wave`). Node health replaces an unhealthy node, then drains it: it waits
for replacement capacity, not for the budget, but its drain counts against the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from market_pipeline.disruption.budget import (
    BudgetRule,
    DisruptionBudget,
    DisruptionMethod,
    DisruptionReason,
    PoolBudget,
)
from market_pipeline.scaling.drain_gates import finish_wave, has_room_for, is_empty
from market_pipeline.scaling.planning import Tick
from market_pipeline.scaling.types import NodeView, ScalerMemory, ScalingConfig, ScalingReason, Why
from market_pipeline.warehouse.decisions import DecisionAction

_HOUR = 3600.0


def scaler_budget(tick: Tick) -> DisruptionBudget:
    """The tick's budget when no caller shares one: the pool's own nodes (in service and
    cordoned) and its drains still moving work (cordoned, not empty, not drained).

    A node whose failed drain was uncordoned this tick counts in service and, in the fleet
    view, still as cordoned: the scaler always counted it twice, and keeping that keeps the
    replays' figures unchanged (counting it once moves vchbv's idle GPU-hours by 0.03%)."""
    drained = {n.node_id for n in tick.drained}
    busy = {
        n.node_id
        for n in tick.fleet.cordoned
        if n.node_id in tick.memory.draining and n.node_id not in drained and not is_empty(n)
    }
    pool = tick.pool_state.pool
    return DisruptionBudget(
        (BudgetRule(percent=tick.config.disruption_budget_pct),),
        tick.now,
        {pool: tick.in_service + len(tick.fleet.cordoned)},
        {pool: busy},
    )


@dataclass(frozen=True)
class ScaleDown:
    """Cordon the ripe surplus nodes as one batch; power the drained batch off."""

    reason: DisruptionReason = DisruptionReason.SCALE_DOWN

    def compute(self, plan: Tick, budget: DisruptionBudget) -> None:
        if plan.surplus > 0:
            _scale_down(plan, plan.surplus, budget.pool(plan.pool_state.pool))
        finish_wave(plan)


@dataclass(frozen=True)
class NodeHealth:
    """Replace an unhealthy node first (its capacity up elsewhere), then drain it."""

    reason: DisruptionReason = DisruptionReason.NODE_HEALTH

    def compute(self, plan: Tick, budget: DisruptionBudget) -> None:
        pool = budget.pool(plan.pool_state.pool)
        for node in plan.fleet.unhealthy:
            if node.node_id in plan.memory.draining or node.node_id in plan.memory.blocked:
                continue
            if len(plan.fleet.schedulable) + plan.uncordoned >= plan.target.nodes:
                plan.memory.draining[node.node_id] = plan.t
                plan.memory.note_cordon(node.node_id, plan.t)
                if not is_empty(node):
                    pool.consume(node.node_id)
                plan.add(
                    DecisionAction.REPLACE,
                    node.node_id,
                    True,
                    [Why(ScalingReason.UNHEALTHY, "replacement capacity is up, drain then remove")],
                )
            else:
                plan.add(
                    DecisionAction.REPLACE,
                    node.node_id,
                    False,
                    [Why(ScalingReason.UNHEALTHY, "waiting for replacement capacity before draining")],
                )


SCALER_METHODS: tuple[DisruptionMethod[Tick], ...] = (ScaleDown(), NodeHealth())


def flap_window_seconds(config: ScalingConfig) -> float:
    """A cordon counts for a day plus the longest a node stays cordoned (a drain's timeout, a
    wave's wait): its uncordon then also falls in the day the cordon is counted in."""
    return 24 * _HOUR + 60.0 * (config.drain_timeout_minutes + config.scale_down_wave_minutes)


def flapping(memory: ScalerMemory, config: ScalingConfig, t: float) -> set[str]:
    """Nodes cordoned `max_cordons_per_day` times already whose drain failed in that time (the
    task-drain guardrail would not empty them): not cordoned again for now. A cordon reversed
    because demand came back is the policy answering demand, paced by the hysteresis."""
    window = flap_window_seconds(config)
    return {
        n
        for n, times in memory.cordons.items()
        if len(times) >= config.max_cordons_per_day and t - memory.drain_failed_at.get(n, -math.inf) < window
    }


def cooling_down(memory: ScalerMemory, config: ScalingConfig, t: float) -> dict[str, float]:
    """Nodes whose drain failed within the failed-scale-down cool-down, and when."""
    window = config.failed_scale_down_cooldown_minutes * 60
    return {n: at for n, at in memory.drain_failed_at.items() if t - at < window}


def min_batch(tick: Tick) -> int:
    """The smallest scale-down worth an action: a share of the pool, at least one node."""
    config = tick.config
    return max(
        config.min_scale_down_nodes, math.ceil(config.min_scale_down_fraction * tick.in_service - 1e-9)
    )


def _scale_down(tick: Tick, surplus: int, budget: PoolBudget) -> None:
    """Per-rank hysteresis, then one batch of every ripe node, cordoned together."""
    memory, config, t = tick.memory, tick.config, tick.t
    for k in [k for k in memory.surplus_since if k > surplus]:
        del memory.surplus_since[k]
    for k in range(1, surplus + 1):
        memory.surplus_since.setdefault(k, t)
    hysteresis_s = config.hysteresis_minutes * 60.0
    ripe = sum(1 for k in range(1, surplus + 1) if t - memory.surplus_since[k] >= hysteresis_s)
    cooling = cooling_down(memory, config, t)
    blocked_by = _pool_gates(tick, surplus, ripe, cooling)
    if blocked_by:
        tick.add(DecisionAction.SCALE_DOWN, None, False, blocked_by)
        return
    leaving: list[NodeView] = []
    # a node whose drain just failed sits its cool-down out; the others stand in for it, so
    # one pinned task neither stalls the pool nor splits its batch into two actions
    for node in sorted((n for n in tick.fleet.schedulable if n.node_id in cooling), key=lambda n: n.node_id):
        ago = (t - cooling[node.node_id]) / 60
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            False,
            [
                Why(
                    ScalingReason.FAILED_SCALE_DOWN_COOLDOWN,
                    f"its drain failed {ago:.0f} min ago; skipped for "
                    f"{config.failed_scale_down_cooldown_minutes - ago:.0f} more min while other nodes stand in",
                ),
            ],
        )
    # a node that would flap, or whose tasks the task-drain guardrail will not move (a
    # protected task), is not cordoned: it would only be uncordoned again
    protected = {n for n, status in tick.drain_status.items() if status.blocked}
    flaps = flapping(memory, config, t)
    reported = memory.blocked.keys() | cooling.keys()  # each already has its own decision
    for node in sorted(
        (n for n in tick.fleet.schedulable if n.node_id in flaps - reported), key=lambda n: n.node_id
    ):
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            False,
            [
                Why(
                    ScalingReason.FLAP_GUARD,
                    f"cordoned {len(memory.cordons[node.node_id])} times in the last day "
                    f"(max_cordons_per_day {config.max_cordons_per_day}); other nodes stand in",
                ),
            ],
        )
    skipped = memory.blocked.keys() | cooling.keys() | flaps | protected
    candidates = sorted(
        (n for n in tick.fleet.schedulable if n.node_id not in skipped),
        key=lambda n: (n.used_gpus, n.node_id),
    )
    for node in candidates:
        if len(leaving) >= ripe:
            break
        if not _within_budget(tick, budget, leaving, node):
            tick.add(
                DecisionAction.SCALE_DOWN,
                node.node_id,
                False,
                [
                    Why(
                        ScalingReason.DISRUPTION_BUDGET,
                        f"draining it would exceed {config.disruption_budget_pct:g}% of the "
                        f"pool's nodes at once or {config.max_removals_per_hour} busy nodes an hour",
                    )
                ],
            )
            continue
        if _try_remove(tick, node, leaving):
            leaving.append(node)
            if not is_empty(node):
                budget.consume(node.node_id)


def _pool_gates(tick: Tick, surplus: int, ripe: int, failed: dict[str, float]) -> list[str | Why]:
    memory, config, t = tick.memory, tick.config, tick.t
    reasons: list[str | Why] = []
    busy = len(memory.draining) - sum(1 for n in tick.drained if n.node_id in memory.draining)
    if busy:
        reasons.append(Why(ScalingReason.BATCH_IN_PROGRESS, f"{busy} node(s) still draining"))
    if (
        memory.last_scale_up_at is not None
        and t - memory.last_scale_up_at < config.scale_up_cooldown_minutes * 60
    ):
        reasons.append(
            Why(
                ScalingReason.SCALE_UP_COOLDOWN,
                f"last scale-up {(t - memory.last_scale_up_at) / 60:.1f} min ago",
            )
        )
    if len(failed) >= config.failed_drains_to_pause_pool:
        # several nodes failing at once is systemic (the drain path itself), not one pinned task
        reasons.append(
            Why(
                ScalingReason.FAILED_SCALE_DOWN_COOLDOWN,
                f"{len(failed)} drains failed in the last "
                f"{config.failed_scale_down_cooldown_minutes:g} min (last {(t - max(failed.values())) / 60:.1f} min ago)",
            )
        )
    if ripe < min_batch(tick):
        longest = (t - memory.surplus_since.get(1, t)) / 60
        reasons.append(
            Why(
                ScalingReason.HYSTERESIS,
                f"{ripe} of {surplus} unneeded node(s) unneeded for {config.hysteresis_minutes:g} "
                f"min (longest {longest:.1f} min); a batch needs {min_batch(tick)}",
            )
        )
    return reasons


def _recent(memory: ScalerMemory, t: float) -> int:
    return sum(1 for r in memory.busy_drains if t - r < _HOUR)


def _within_budget(tick: Tick, budget: PoolBudget, leaving: list[NodeView], node: NodeView) -> bool:
    """The one disruption budget on nodes with work (an empty node disrupts nothing), and the
    hourly rate: at most `max_removals_per_hour` nodes with work go per hour."""
    if is_empty(node):
        return True
    busy = sum(1 for n in leaving if not is_empty(n)) + 1
    return budget.allows(DisruptionReason.SCALE_DOWN, node.node_id) and (
        busy + _recent(tick.memory, tick.t) <= tick.config.max_removals_per_hour
    )


def _try_remove(tick: Tick, node: NodeView, leaving: list[NodeView]) -> bool:
    """Gate one candidate; on success cordon it so the task-drain guardrail empties it."""
    memory, config, t = tick.memory, tick.config, tick.t
    remaining = tick.in_service - len(leaving) - 1
    admissible, margin = tick.certified_at(remaining)
    rank = len(leaving) + 1
    unneeded_s = t - memory.surplus_since.get(rank, t)
    inputs = {"unneeded_minutes": round(unneeded_s / 60, 2), "used_gpus": node.used_gpus}
    if not admissible or remaining < tick.pool_state.min_nodes:
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            False,
            [f"certificate fails at {remaining} nodes (margin {margin:.2f} GPUs)"],
            margin,
            **inputs,
        )
        return False
    hours = min(config.max_expected_off_hours, max(unneeded_s, config.hysteresis_minutes * 60) / _HOUR)
    saving = node.gpus * tick.pool_state.gpu_hour_cost * hours
    cost = node.used_gpus * config.drain_cost_per_gpu + config.replacement_cost_per_node
    if saving <= cost:
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            False,
            [
                Why(
                    ScalingReason.NO_SAVING,
                    f"expected saving {saving:.2f} <= drain+replacement cost {cost:.2f}",
                )
            ],
            margin,
            saving=saving,
            cost=cost,
            **inputs,
        )
        return False
    picked = {n.node_id for n in leaving}
    others = [n for n in tick.fleet.schedulable if n.node_id != node.node_id and n.node_id not in picked]
    if not has_room_for(node, others):
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            False,
            [Why(ScalingReason.NO_ROOM, "its tasks do not fit on the remaining nodes")],
            margin,
            **inputs,
        )
        return False
    tick.add(
        DecisionAction.CORDON,
        node.node_id,
        True,
        [
            "drain requested from the task-drain guardrail: tasks move to room already up "
            "(replace before remove); powered off once the batch is drained",
            f"unneeded {unneeded_s / 60:.1f} min",
            f"saves {saving:.2f} > cost {cost:.2f}",
            f"certified at {remaining} nodes (margin {margin:.2f} GPUs)",
        ],
        margin,
        saving=saving,
        cost=cost,
        **inputs,
    )
    memory.draining[node.node_id] = t
    memory.note_cordon(node.node_id, t)
    if not is_empty(node):
        memory.busy_drains.append(t)  # a drain that moves work: counts against the hourly budget
    return True
