"""Scale-down steps that wait on the task-drain guardrail: progress, failure, blocked nodes."""

from __future__ import annotations

from market_pipeline.scaling.planning import Tick
from market_pipeline.scaling.types import NodeState, NodeView, ScalingReason, Why
from market_pipeline.scaling.warm_pool import power_off_target
from market_pipeline.warehouse.decisions import DecisionAction

_FIT_EPS = 1e-9


def is_empty(node: NodeView) -> bool:
    return node.used_gpus <= 0 and not node.task_gpus


def has_room_for(node: NodeView, others: list[NodeView]) -> bool:
    """Whether the node's tasks fit in the free GPUs of `others` (already running nodes).

    With known task sizes this is first-fit decreasing (a task cannot straddle nodes);
    without them only the aggregate free GPUs are compared.
    """
    if is_empty(node):
        return True
    free = sorted((other.free_gpus for other in others), reverse=True)
    if not node.task_gpus:
        return sum(free) + _FIT_EPS >= node.used_gpus
    for size in sorted(node.task_gpus, reverse=True):
        for i, room in enumerate(free):
            if room + _FIT_EPS >= size:
                free[i] = room - size
                break
        else:
            return False
    return True


def progress_drains(tick: Tick, by_id: dict[str, NodeView]) -> None:
    """Advance the drains this policy started; power a batch off once all of it is drained.

    Powering the batch off together makes one scale-down action of it, and a failed drain
    in the batch no longer holds the others back: it is uncordoned and counted.
    """
    _recheck_blocked(tick, by_id)
    memory, config, t = tick.memory, tick.config, tick.t
    drained: list[NodeView] = []
    waiting = 0
    for node_id, started in sorted(memory.draining.items()):
        node = by_id.get(node_id)
        if node is None or node.state is not NodeState.CORDONED:
            # removed, or the cordon was lifted (or, in shadow mode, never applied)
            del memory.draining[node_id]
            continue
        status = tick.drain_status.get(node_id)
        if is_empty(node) or (status is not None and status.all_tasks_drained_or_migrated):
            drained.append(node)
        elif (status is not None and status.blocked) or t - started > config.drain_timeout_minutes * 60:
            _fail_drain(
                tick, node, status.reason if status is not None and status.blocked else "drain timed out"
            )
        else:
            waiting += 1
            tick.add(
                DecisionAction.HOLD,
                node_id,
                True,
                [Why(ScalingReason.DRAIN_IN_PROGRESS, f"{(t - started) / 60:.1f} min")],
            )
    if waiting:
        for node in drained:
            tick.add(
                DecisionAction.HOLD, node.node_id, True, [f"drained; waiting for {waiting} more of its batch"]
            )
        return
    tick.drained = drained  # powered off by `finish_wave` once the scale-down has had its say


def finish_wave(tick: Tick) -> None:
    """Power the drained batch off together, unless this tick extended its wave.

    The disruption budget lets busy nodes drain only a few at a time, so a larger surplus
    drains in waves. A drained node is held (cordoned, empty, counted as idle) while the
    next wave drains, for at most `scale_down_wave_minutes`, and the whole batch is then
    powered off as one action instead of one action a wave. A held node is the first one
    uncordoned if demand returns meanwhile (`_scale_up`).
    """
    memory, config = tick.memory, tick.config
    held = [node for node in tick.drained if node.node_id in memory.draining]
    if not held:
        return
    extended = any(d.action == DecisionAction.CORDON and d.allowed for d in tick.decisions)
    oldest = min(memory.draining[node.node_id] for node in held)
    if extended and all(n.healthy for n in held) and tick.t - oldest < config.scale_down_wave_minutes * 60:
        for node in held:
            tick.add(
                DecisionAction.HOLD,
                node.node_id,
                True,
                [
                    "drained; held while the next wave of its scale-down drains (powered off together)",
                ],
            )
        return
    for node in held:
        _finish_drained(tick, node)
        del memory.draining[node.node_id]


def _finish_drained(tick: Tick, node: NodeView) -> None:
    if not node.healthy:
        # powered fully off for repair: a sick node must not be resumed from the warm pool
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            True,
            ["unhealthy node drained; its replacement is up"],
            to="off",
        )
        return
    admissible, margin = tick.certified_at(tick.in_service)
    if admissible:
        tick.add(
            DecisionAction.SCALE_DOWN,
            node.node_id,
            True,
            ["all tasks drained or migrated", f"certified without it (margin {margin:.2f} GPUs)"],
            margin,
            to=power_off_target(tick),
        )
    else:
        tick.uncordoned += 1
        tick.memory.note_uncordon(node.node_id, tick.t)
        tick.add(
            DecisionAction.UNCORDON,
            node.node_id,
            True,
            [f"certificate no longer holds without this node (margin {margin:.2f} GPUs)"],
            margin,
        )


def _fail_drain(tick: Tick, node: NodeView, why: str) -> None:
    memory = tick.memory
    del memory.draining[node.node_id]
    failures = memory.drain_failures.get(node.node_id, 0) + 1
    memory.drain_failures[node.node_id] = failures
    memory.drain_failed_at[node.node_id] = tick.t
    if node.healthy:
        tick.uncordoned += 1
    reasons: list[str | Why] = [
        f"scale-down failed: {why}",
        f"attempt {failures}/{tick.config.max_drain_attempts}",
    ]
    if failures >= tick.config.max_drain_attempts:
        memory.blocked[node.node_id] = tick.t
        reasons.append(Why(ScalingReason.BLOCKED_DRAIN, "reported and skipped, not retried every tick"))
    memory.note_uncordon(node.node_id, tick.t)
    tick.add(DecisionAction.UNCORDON, node.node_id, True, reasons, drain_failures=failures)


def _recheck_blocked(tick: Tick, by_id: dict[str, NodeView]) -> None:
    memory, config, t = tick.memory, tick.config, tick.t
    for node_id, since in sorted(memory.blocked.items()):
        node = by_id.get(node_id)
        status = tick.drain_status.get(node_id)
        cleared = (node is not None and is_empty(node)) or (
            status is not None and status.all_tasks_drained_or_migrated and not status.blocked
        )
        if cleared:
            del memory.blocked[node_id]
            memory.drain_failures[node_id] = 0
        elif t - since >= config.blocked_recheck_minutes * 60:
            # one more attempt per recheck period: bounded, never a retry loop
            del memory.blocked[node_id]
            memory.drain_failures[node_id] = config.max_drain_attempts - 1
