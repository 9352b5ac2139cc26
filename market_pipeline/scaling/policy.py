"""The per-pool scaling policy: one call per control-loop tick, live or in a replay.

Target: the *need* is the least node count whose capacity certifies, at the equilibrium
price, the larger of the forecast's upper quantile and the observed demand plus headroom;
the pool *keeps* up to a band above it (a share of the need, or one typical step of its
demand) while a recent peak (keep window) would need it, and never lets nodes in service
plus the warm pool fall below what keeps the week's peak drainable at `price_max`
(`capacity.target_capacity`, `warm_pool`).

Scale up (uncordon leaving nodes, then the warm pool, then cold nodes) when the need
exceeds the nodes in service — at once if no price within bounds certifies the shortfall,
after one tick if pricing it would cost more than `max_transient_price_ratio`, otherwise
only if it lasts `scale_up_persistence_minutes`: pricing handles transient imbalance,
scaling handles trends (seed 000 §2.3). While demand leaves GPUs free and nothing queues,
the shortfall is the headroom's or the forecast's alone and must last one tick
(`anticipatory_persistence_minutes`): a one-tick spike is priced. Scale down only a node
that (a) leaves the equilibrium price certified at the lower capacity, (b) has every task
drained or migrated by the task-drain guardrail (an empty node needs no drain), (c) has
been unneeded for the hysteresis period, (d) saves more than its drain and replacement
cost, (e) fits the disruption budget; a batch of such nodes is cordoned together and
powered off together. When the budget lets busy nodes drain only a few at a time, drained
nodes wait (for at most `scale_down_wave_minutes`) for the next wave and the batch goes in
one action. Tasks only move to room that is already up (replace before remove); an
unhealthy node is replaced first, then drained. Cool-downs follow a scale-up and a failed
scale-down; a node whose drain keeps failing is reported as `blocked_drain` and skipped,
not retried.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from market_pipeline.guardrails.backlog import PriceCapacityAction, shield
from market_pipeline.scaling.capacity import (
    CapacityTarget,
    FleetView,
    backlog_state,
    fleet_view,
    record_demand,
    target_capacity,
)
from market_pipeline.scaling.drain_gates import finish_wave, has_room_for, progress_drains
from market_pipeline.scaling.planning import Tick
from market_pipeline.scaling.types import (
    DrainStatus,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingDecision,
    ScalingError,
    as_utc,
)
from market_pipeline.scaling.warm_pool import interval_resumes, stock_warm_pool, trim_warm_pool

_HOUR = 3600.0


def plan_pool(
    pool_state: PoolState,
    forecast_q90: float,
    price: float,
    nodes: list[NodeView],
    drain_status: Mapping[str, DrainStatus],
    config: ScalingConfig,
    now: dt.datetime,
    *,
    memory: ScalerMemory,
) -> list[ScalingDecision]:
    """Decide this tick's scaling actions for one pool; updates `memory` in place.

    `price` is the equilibrium price (the capacity is sized so that it is certified);
    `forecast_q90` the forecast's upper quantile of demand over the next interval.
    Every returned decision says whether it is allowed and why.
    """
    if memory.pool != pool_state.pool:
        raise ScalingError(f"memory.pool: {memory.pool!r} is not pool {pool_state.pool!r}")
    ids = [node.node_id for node in nodes]
    if len(ids) != len(set(ids)):
        raise ScalingError("nodes: duplicate node_id")
    now = as_utc(now)
    fleet = fleet_view(nodes)
    envelope = record_demand(memory, pool_state.demand_gpus, now.timestamp(), config)
    warm_capacity = len(fleet.standby) + max(0, pool_state.max_nodes - fleet.powered - fleet.warm_stock)
    target = target_capacity(pool_state, forecast_q90, price, config, envelope, warm_capacity)
    tick = Tick(
        pool_state=pool_state, forecast_q90=forecast_q90, price=price, config=config, now=now,
        t=now.timestamp(), memory=memory, fleet=fleet, target=target, drain_status=drain_status,
        base_inputs=_base_inputs(pool_state, forecast_q90, price, fleet, target),
    )
    _forget_gone_nodes(memory, nodes, tick.t, config)
    progress_drains(tick, {node.node_id: node for node in nodes})
    if target.need_nodes > tick.in_service:
        memory.surplus_since.clear()
        if _scale_up_due(tick):
            _scale_up(tick, target.nodes + config.scale_up_extra_nodes - tick.in_service)
    else:
        memory.need_since = None
        if target.nodes < tick.in_service:
            _scale_down(tick, tick.in_service - target.nodes)
        else:
            memory.surplus_since.clear()
    finish_wave(tick)
    _replace_unhealthy(tick)
    _report_blocked(tick)
    stock_warm_pool(tick)
    trim_warm_pool(tick)
    if not tick.decisions:
        tick.add("hold", None, True, [f"in service {tick.in_service} nodes = target {target.nodes}"])
    return tick.decisions


def _base_inputs(
    pool_state: PoolState, forecast_q90: float, price: float, fleet: FleetView, target: CapacityTarget
) -> dict[str, Any]:
    cert = target.shielded.certificate
    return {
        "forecast_q90": forecast_q90, "price": price, "demand_gpus": pool_state.demand_gpus,
        "backlog_gpus": pool_state.backlog_gpus, "target_nodes": target.nodes, "need_nodes": target.need_nodes,
        "keep_nodes": target.keep_nodes, "keep_band_nodes": target.band_nodes,
        "demand_need_nodes": target.demand_need_nodes, "demand_step_gpus": round(target.step_gpus, 3),
        "wanted_gpus": round(target.wanted_gpus, 3), "schedulable": len(fleet.schedulable),
        "booting": len(fleet.booting), "cordoned": len(fleet.cordoned), "standby": len(fleet.standby),
        "warming": len(fleet.warming), "floor_nodes": target.floor_nodes, "max_nodes": pool_state.max_nodes,
        "target_certified": cert.admissible, "target_shield": list(target.shielded.why),
    }


def _forget_gone_nodes(memory: ScalerMemory, nodes: list[NodeView], t: float, config: ScalingConfig) -> None:
    present = {node.node_id for node in nodes}
    for book in (memory.drain_failures, memory.blocked, memory.drain_failed_at, memory.cordons, memory.uncordons):
        for node_id in [n for n in book if n not in present]:
            del book[node_id]
    memory.busy_drains = [r for r in memory.busy_drains if t - r < 24 * _HOUR]
    window = flap_window_seconds(config)
    for book in (memory.cordons, memory.uncordons):
        for node_id in list(book):
            book[node_id] = [c for c in book[node_id] if t - c < window]
            if not book[node_id]:
                del book[node_id]


def flap_window_seconds(config: ScalingConfig) -> float:
    """A cordon counts for a day plus the longest a node stays cordoned (a drain's timeout, a
    wave's wait): its uncordon then also falls in the day the cordon is counted in."""
    return 24 * _HOUR + 60.0 * (config.drain_timeout_minutes + config.scale_down_wave_minutes)


def flapping(memory: ScalerMemory, config: ScalingConfig, t: float) -> set[str]:
    """Nodes cordoned `max_cordons_per_day` times already whose drain failed in that time (the
    task-drain guardrail would not empty them): not cordoned again for now. A cordon reversed
    because demand came back is the policy answering demand, paced by the hysteresis."""
    window = flap_window_seconds(config)
    return {n for n, times in memory.cordons.items()
            if len(times) >= config.max_cordons_per_day and t - memory.drain_failed_at.get(n, -math.inf) < window}


def _scale_up_due(tick: Tick) -> bool:
    """Scale up at once for an imbalance pricing cannot absorb; else only if it persists.

    Pricing handles transient imbalance, scaling handles trends: while GPUs are free the
    shortfall must last `anticipatory_persistence_minutes`; while the price that certifies
    the capacity in service stays within `max_transient_price_ratio` of the equilibrium
    price, `scale_up_persistence_minutes`."""
    memory, config = tick.memory, tick.config
    memory.need_since = tick.t if memory.need_since is None else memory.need_since
    gpus = float(tick.in_service * tick.pool_state.node_gpus)
    state = backlog_state(tick.pool_state, tick.forecast_q90, tick.price, gpus)
    ceiling = min(config.backlog.price_max, tick.pool_state.price_ceiling)  # what the next tick may publish
    shielded = shield(PriceCapacityAction(tick.price, gpus), state, replace(config.backlog, price_max=ceiling))
    ratio = shielded.price / tick.price
    waited = (tick.t - memory.need_since) / 60.0
    if not shielded.feasible:
        return True  # no price within bounds drains it: capacity at once
    wait, demand = config.anticipatory_persistence_minutes, tick.pool_state.demand_gpus
    if demand < gpus - 1e-9 and tick.pool_state.backlog_gpus <= 1e-9 and waited < wait:
        kind = f"anticipatory ({demand:g} GPUs leave some of the nodes free)"
    elif ratio > config.max_transient_price_ratio and waited >= config.urgent_persistence_minutes:
        return True  # too dear for pricing alone, and not a one-tick blip
    elif waited >= config.scale_up_persistence_minutes:
        return True
    else:
        kind, wait = "transient", config.scale_up_persistence_minutes
    reason = f"{kind}: need {tick.target.need_nodes} > {tick.in_service} nodes for {waited:.0f} min < {wait:g}"
    tick.add("hold", None, True, [f"{reason}; price x{ratio:.3f} absorbs it"], shielded.certificate.margin,
             transient_price_ratio=ratio)
    return False


def _scale_up(tick: Tick, needed: int) -> None:
    memory = tick.memory
    leaving = [n for n in tick.fleet.cordoned if n.node_id in memory.draining and n.healthy]
    for node in leaving[:needed]:
        del memory.draining[node.node_id]
        tick.uncordoned += 1
        memory.note_uncordon(node.node_id, tick.t)
        tick.add("uncordon", node.node_id, True, ["demand needs this node again: cancel its drain"])
    needed -= min(needed, len(leaving))
    standby = sorted(tick.fleet.standby, key=lambda n: n.node_id)
    warm = standby[: needed + interval_resumes(tick, standby[:needed], standby[needed:])]
    for node in warm:
        tick.add("power_on", node.node_id, True, [f"scale up from the warm pool toward {tick.target.nodes} nodes"])
    needed -= min(needed, len(warm))
    room = tick.pool_state.max_nodes - tick.fleet.powered - tick.fleet.warm_stock
    cold = min(needed, max(0, room))
    if cold > 0:
        tick.add("scale_up", None, True, [f"warm pool empty: provision {cold} cold node(s)"], count=cold)
    priced = tick.target.shielded.price > tick.price * (1 + 1e-9)
    if needed > cold or priced:
        tick.add(
            "scale_up", None, False,
            [f"at max_nodes {tick.pool_state.max_nodes}: {max(0, needed - cold)} node(s) short; "
             f"the price shield covers the gap (x{tick.target.shielded.price / tick.price:.3f})"],
            count=max(0, needed - cold),
        )
    if leaving[:1] or warm or cold:
        memory.last_scale_up_at = tick.t
        memory.need_since = None


def _scale_down(tick: Tick, surplus: int) -> None:
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
        tick.add("scale_down", None, False, blocked_by)
        return
    leaving: list[NodeView] = []
    # a node whose drain just failed sits its cool-down out; the others stand in for it, so
    # one pinned task neither stalls the pool nor splits its batch into two actions
    for node in sorted((n for n in tick.fleet.schedulable if n.node_id in cooling), key=lambda n: n.node_id):
        ago = (t - cooling[node.node_id]) / 60
        tick.add("scale_down", node.node_id, False, [
            f"failed_scale_down_cooldown: its drain failed {ago:.0f} min ago; "
            f"skipped for {config.failed_scale_down_cooldown_minutes - ago:.0f} more min while other nodes stand in",
        ])
    # a node that would flap, or whose tasks the task-drain guardrail will not move (a
    # protected task), is not cordoned: it would only be uncordoned again
    protected = {n for n, status in tick.drain_status.items() if status.blocked}
    flaps = flapping(memory, config, t)
    reported = memory.blocked.keys() | cooling.keys()  # each already has its own decision
    for node in sorted((n for n in tick.fleet.schedulable if n.node_id in flaps - reported), key=lambda n: n.node_id):
        tick.add("scale_down", node.node_id, False, [
            f"flap_guard: cordoned {len(memory.cordons[node.node_id])} times in the last day "
            f"(max_cordons_per_day {config.max_cordons_per_day}); other nodes stand in",
        ])
    skipped = memory.blocked.keys() | cooling.keys() | flaps | protected
    candidates = sorted(
        (n for n in tick.fleet.schedulable if n.node_id not in skipped),
        key=lambda n: (n.used_gpus, n.node_id),
    )
    for node in candidates:
        if len(leaving) >= ripe:
            break
        if not _within_budget(tick, leaving, node):
            tick.add("scale_down", node.node_id, False, [
                f"disruption_budget: draining it would exceed {config.disruption_budget_pct:g}% of the "
                f"pool's nodes at once or {config.max_removals_per_hour} busy nodes an hour",
            ])
            continue
        if _try_remove(tick, node, leaving):
            leaving.append(node)


def min_batch(tick: Tick) -> int:
    """The smallest scale-down worth an action: a share of the pool, at least one node."""
    config = tick.config
    return max(config.min_scale_down_nodes, math.ceil(config.min_scale_down_fraction * tick.in_service - 1e-9))


def _pool_gates(tick: Tick, surplus: int, ripe: int, failed: dict[str, float]) -> list[str]:
    memory, config, t = tick.memory, tick.config, tick.t
    reasons = []
    busy = len(memory.draining) - sum(1 for n in tick.drained if n.node_id in memory.draining)
    if busy:
        reasons.append(f"batch_in_progress: {busy} node(s) still draining")
    if memory.last_scale_up_at is not None and t - memory.last_scale_up_at < config.scale_up_cooldown_minutes * 60:
        reasons.append(f"scale_up_cooldown: last scale-up {(t - memory.last_scale_up_at) / 60:.1f} min ago")
    if len(failed) >= config.failed_drains_to_pause_pool:
        # several nodes failing at once is systemic (the drain path itself), not one pinned task
        reasons.append(
            f"failed_scale_down_cooldown: {len(failed)} drains failed in the last "
            f"{config.failed_scale_down_cooldown_minutes:g} min (last {(t - max(failed.values())) / 60:.1f} min ago)"
        )
    if ripe < min_batch(tick):
        longest = (t - memory.surplus_since.get(1, t)) / 60
        reasons.append(
            f"hysteresis: {ripe} of {surplus} unneeded node(s) unneeded for {config.hysteresis_minutes:g} min "
            f"(longest {longest:.1f} min); a batch needs {min_batch(tick)}"
        )
    return reasons


def cooling_down(memory: ScalerMemory, config: ScalingConfig, t: float) -> dict[str, float]:
    """Nodes whose drain failed within the failed-scale-down cool-down, and when."""
    window = config.failed_scale_down_cooldown_minutes * 60
    return {n: at for n, at in memory.drain_failed_at.items() if t - at < window}


def _recent(memory: ScalerMemory, t: float) -> int:
    return sum(1 for r in memory.busy_drains if t - r < _HOUR)


def _within_budget(tick: Tick, leaving: list[NodeView], node: NodeView) -> bool:
    """Karpenter-style budget on nodes with work (an empty node disrupts nothing).

    At most `disruption_budget_pct` of the pool's nodes (rounded up, at least one) drain at
    once, and at most `max_removals_per_hour` nodes with work go per hour.
    """
    if node.used_gpus <= 0 and not node.task_gpus:
        return True
    busy = sum(1 for n in leaving if n.used_gpus > 0 or n.task_gpus) + 1
    pool_nodes = tick.in_service + len(tick.fleet.cordoned)
    allowed = max(1, math.ceil(tick.config.disruption_budget_pct / 100.0 * pool_nodes - 1e-9))
    return busy <= allowed and busy + _recent(tick.memory, tick.t) <= tick.config.max_removals_per_hour


def _try_remove(tick: Tick, node: NodeView, leaving: list[NodeView]) -> bool:
    """Gate one candidate; on success cordon it so the task-drain guardrail empties it."""
    memory, config, t = tick.memory, tick.config, tick.t
    remaining = tick.in_service - len(leaving) - 1
    admissible, margin = tick.certified_at(remaining)
    rank = len(leaving) + 1
    unneeded_s = t - memory.surplus_since.get(rank, t)
    inputs = {"unneeded_minutes": round(unneeded_s / 60, 2), "used_gpus": node.used_gpus}
    if not admissible or remaining < tick.pool_state.min_nodes:
        tick.add("scale_down", node.node_id, False,
                 [f"certificate fails at {remaining} nodes (margin {margin:.2f} GPUs)"], margin, **inputs)
        return False
    hours = min(config.max_expected_off_hours, max(unneeded_s, config.hysteresis_minutes * 60) / _HOUR)
    saving = node.gpus * tick.pool_state.gpu_hour_cost * hours
    cost = node.used_gpus * config.drain_cost_per_gpu + config.replacement_cost_per_node
    if saving <= cost:
        tick.add("scale_down", node.node_id, False,
                 [f"no_saving: expected saving {saving:.2f} <= drain+replacement cost {cost:.2f}"],
                 margin, saving=saving, cost=cost, **inputs)
        return False
    picked = {n.node_id for n in leaving}
    others = [n for n in tick.fleet.schedulable if n.node_id != node.node_id and n.node_id not in picked]
    if not has_room_for(node, others):
        tick.add("scale_down", node.node_id, False,
                 ["no_room: its tasks do not fit on the remaining nodes"], margin, **inputs)
        return False
    tick.add("cordon", node.node_id, True, [
        "drain requested from the task-drain guardrail: tasks move to room already up "
        "(replace before remove); powered off once the batch is drained",
        f"unneeded {unneeded_s / 60:.1f} min", f"saves {saving:.2f} > cost {cost:.2f}",
        f"certified at {remaining} nodes (margin {margin:.2f} GPUs)",
    ], margin, saving=saving, cost=cost, **inputs)
    memory.draining[node.node_id] = t
    memory.note_cordon(node.node_id, t)
    if node.used_gpus > 0 or node.task_gpus:
        memory.busy_drains.append(t)  # a drain that moves work: counts against the hourly budget
    return True


def _replace_unhealthy(tick: Tick) -> None:
    for node in tick.fleet.unhealthy:
        if node.node_id in tick.memory.draining or node.node_id in tick.memory.blocked:
            continue
        if len(tick.fleet.schedulable) + tick.uncordoned >= tick.target.nodes:
            tick.memory.draining[node.node_id] = tick.t
            tick.memory.note_cordon(node.node_id, tick.t)
            tick.add("replace", node.node_id, True,
                     ["unhealthy: replacement capacity is up, drain then remove"])
        else:
            tick.add("replace", node.node_id, False,
                     ["unhealthy: waiting for replacement capacity before draining"])


def _report_blocked(tick: Tick) -> None:
    for node_id, since in sorted(tick.memory.blocked.items()):
        tick.add("hold", node_id, False, [
            "blocked_drain",
            f"drain failed {tick.memory.drain_failures.get(node_id, 0)} time(s); skipped since "
            f"{(tick.t - since) / 60:.0f} min, recheck after {tick.config.blocked_recheck_minutes:g} min",
        ])
