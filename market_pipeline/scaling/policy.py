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
scaling handles trends (a node is slow and costly to add or remove, a price is not). While demand leaves GPUs free and nothing queues,
the shortfall is the headroom's or the forecast's alone and must last one tick
(`anticipatory_persistence_minutes`): a one-tick spike is priced. Scale down only a node
that (a) leaves the equilibrium price certified at the lower capacity, (b) has every task
drained or migrated by the task-drain guardrail (an empty node needs no drain), (c) has
been unneeded for the hysteresis period, (d) saves more than its drain and replacement
cost, (e) fits the disruption budget; a batch of such nodes is cordoned together and
powered off together (`disruption`: the scale-down and node-health methods, consuming from the
tick's one disruption budget). When the budget lets busy nodes drain only a few at a time, drained
nodes wait (for at most `scale_down_wave_minutes`) for the next wave and the batch goes in
one action. Tasks only move to room that is already up (replace before remove); an
unhealthy node is replaced first, then drained. Cool-downs follow a scale-up and a failed
scale-down; a node whose drain keeps failing is reported as `blocked_drain` and skipped,
not retried.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import replace

from market_pipeline.disruption.budget import DisruptionBudget, run_methods
from market_pipeline.scaling.capacity import (
    CapacityTarget,
    FleetView,
    backlog_state,
    fleet_view,
    record_demand,
    target_capacity,
)
from market_pipeline.scaling.disruption import SCALER_METHODS, flap_window_seconds, scaler_budget
from market_pipeline.scaling.drain_gates import progress_drains
from market_pipeline.scaling.planning import Tick
from market_pipeline.scaling.types import (
    DrainStatus,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingDecision,
    ScalingError,
    ScalingReason,
    Why,
    as_utc,
)
from market_pipeline.scaling.warm_pool import interval_resumes, stock_warm_pool, trim_warm_pool
from market_pipeline.tick.certificate import PriceCapacityAction, shield
from market_pipeline.warehouse.decision_inputs import ScaleInputs
from market_pipeline.warehouse.decisions import DecisionAction

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
    budget: DisruptionBudget | None = None,
) -> list[ScalingDecision]:
    """Decide this tick's scaling actions for one pool; updates `memory` in place.

    `price` is the equilibrium price (the capacity is sized so that it is certified);
    `forecast_q90` the forecast's upper quantile of demand over the next interval.
    `budget` is the tick's one disruption budget, shared with the task-drain planner; the
    scaler's methods (`disruption.SCALER_METHODS`) consume from it. Without one the pool's
    own is built (`disruption.scaler_budget`). Every returned decision says whether it is
    allowed and why.
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
        pool_state=pool_state,
        forecast_q90=forecast_q90,
        price=price,
        config=config,
        now=now,
        t=now.timestamp(),
        memory=memory,
        fleet=fleet,
        target=target,
        drain_status=drain_status,
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
        tick.surplus = max(0, tick.in_service - target.nodes)
        if not tick.surplus:
            memory.surplus_since.clear()
    run_methods(SCALER_METHODS, tick, budget if budget is not None else scaler_budget(tick))
    _report_blocked(tick)
    stock_warm_pool(tick)
    trim_warm_pool(tick)
    if not tick.decisions:
        tick.add(
            DecisionAction.HOLD, None, True, [f"in service {tick.in_service} nodes = target {target.nodes}"]
        )
    return tick.decisions


def _base_inputs(
    pool_state: PoolState, forecast_q90: float, price: float, fleet: FleetView, target: CapacityTarget
) -> ScaleInputs:
    cert = target.shielded.certificate
    return ScaleInputs(
        forecast_q90=forecast_q90,
        price=price,
        demand_gpus=pool_state.demand_gpus,
        backlog_gpus=pool_state.backlog_gpus,
        target_nodes=target.nodes,
        need_nodes=target.need_nodes,
        keep_nodes=target.keep_nodes,
        keep_band_nodes=target.band_nodes,
        demand_need_nodes=target.demand_need_nodes,
        demand_step_gpus=round(target.step_gpus, 3),
        wanted_gpus=round(target.wanted_gpus, 3),
        schedulable=len(fleet.schedulable),
        booting=len(fleet.booting),
        cordoned=len(fleet.cordoned),
        standby=len(fleet.standby),
        warming=len(fleet.warming),
        floor_nodes=target.floor_nodes,
        max_nodes=pool_state.max_nodes,
        target_certified=cert.admissible,
        target_shield=tuple(target.shielded.why),
    )


def _forget_gone_nodes(memory: ScalerMemory, nodes: list[NodeView], t: float, config: ScalingConfig) -> None:
    present = {node.node_id for node in nodes}
    for book in (
        memory.drain_failures,
        memory.blocked,
        memory.drain_failed_at,
        memory.cordons,
        memory.uncordons,
    ):
        for node_id in [n for n in book if n not in present]:
            del book[node_id]
    memory.busy_drains = [r for r in memory.busy_drains if t - r < 24 * _HOUR]
    window = flap_window_seconds(config)
    for book in (memory.cordons, memory.uncordons):
        for node_id in list(book):
            book[node_id] = [c for c in book[node_id] if t - c < window]
            if not book[node_id]:
                del book[node_id]


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
    shielded = shield(
        PriceCapacityAction(tick.price, gpus), state, replace(config.backlog, price_max=ceiling)
    )
    ratio = shielded.price / tick.price
    waited = (tick.t - memory.need_since) / 60.0
    if not shielded.feasible:
        return True  # no price within bounds drains it: capacity at once
    wait, demand = config.anticipatory_persistence_minutes, tick.pool_state.demand_gpus
    if demand < gpus - 1e-9 and tick.pool_state.backlog_gpus <= 1e-9 and waited < wait:
        code, aside = ScalingReason.ANTICIPATORY, f"{demand:g} GPUs leave some of the nodes free"
    elif ratio > config.max_transient_price_ratio and waited >= config.urgent_persistence_minutes:
        return True  # too dear for pricing alone, and not a one-tick blip
    elif waited >= config.scale_up_persistence_minutes:
        return True
    else:
        code, aside, wait = ScalingReason.TRANSIENT, "", config.scale_up_persistence_minutes
    reason = Why(
        code,
        f"need {tick.target.need_nodes} > {tick.in_service} nodes for {waited:.0f} min < {wait:g}; "
        f"price x{ratio:.3f} absorbs it",
        aside,
    )
    tick.add(
        DecisionAction.HOLD, None, True, [reason], shielded.certificate.margin, transient_price_ratio=ratio
    )
    return False


def _scale_up(tick: Tick, needed: int) -> None:
    memory = tick.memory
    leaving = [n for n in tick.fleet.cordoned if n.node_id in memory.draining and n.healthy]
    for node in leaving[:needed]:
        del memory.draining[node.node_id]
        tick.uncordoned += 1
        memory.note_uncordon(node.node_id, tick.t)
        tick.add(
            DecisionAction.UNCORDON, node.node_id, True, ["demand needs this node again: cancel its drain"]
        )
    needed -= min(needed, len(leaving))
    standby = sorted(tick.fleet.standby, key=lambda n: n.node_id)
    warm = standby[: needed + interval_resumes(tick, standby[:needed], standby[needed:])]
    for node in warm:
        tick.add(
            DecisionAction.POWER_ON,
            node.node_id,
            True,
            [f"scale up from the warm pool toward {tick.target.nodes} nodes"],
        )
    needed -= min(needed, len(warm))
    room = tick.pool_state.max_nodes - tick.fleet.powered - tick.fleet.warm_stock
    cold = min(needed, max(0, room))
    if cold > 0:
        tick.add(
            DecisionAction.SCALE_UP,
            None,
            True,
            [f"warm pool empty: provision {cold} cold node(s)"],
            count=cold,
        )
    priced = tick.target.shielded.price > tick.price * (1 + 1e-9)
    if needed > cold or priced:
        tick.add(
            DecisionAction.SCALE_UP,
            None,
            False,
            [
                f"at max_nodes {tick.pool_state.max_nodes}: {max(0, needed - cold)} node(s) short; "
                f"the price shield covers the gap (x{tick.target.shielded.price / tick.price:.3f})"
            ],
            count=max(0, needed - cold),
        )
    if leaving[:1] or warm or cold:
        memory.last_scale_up_at = tick.t
        memory.need_since = None


def _report_blocked(tick: Tick) -> None:
    for node_id, since in sorted(tick.memory.blocked.items()):
        tick.add(
            DecisionAction.HOLD,
            node_id,
            False,
            [
                Why(ScalingReason.BLOCKED_DRAIN),
                f"drain failed {tick.memory.drain_failures.get(node_id, 0)} time(s); skipped since "
                f"{(tick.t - since) / 60:.0f} min, recheck after {tick.config.blocked_recheck_minutes:g} min",
            ],
        )
