"""The warm pool: standby nodes that resume within an interval (scale up by waking nodes
from the idle pool, scale down by powering nodes into the energy-saving pool, so that a
scale-up costs a resume, not a cold boot).

Its size is what the backlog guardrail asks for: at least `warm_pool_nodes`, and enough
that the nodes in service plus the warm pool keep a typical recent demand peak drainable
at `price_max` (`CapacityTarget.floor_nodes`); with `warm_to_recent_peak`, also enough to
return to the peak of the last `warm_reserve_window_hours` at the equilibrium price
(`peak_nodes`): on Helios most of the demand the price shield turned away fell in ticks
whose scale-up had to boot cold nodes (8 min, longer than the 5-min tick). A scale-up
from the pool resumes enough nodes that the capacity serving over the tick certifies
(`interval_resumes`), not only the node count. Keeping that reserve warm rather than
powered is what lets the pool shrink through a lull without becoming undrainable when the
demand returns; standby GPU-hours are reported next to idle ones.
"""

from __future__ import annotations

import math

from market_pipeline.scaling.capacity import backlog_state, serving_capacity_gpus, warm_share
from market_pipeline.scaling.planning import Tick
from market_pipeline.scaling.types import NodeView, ScalingReason, Why
from market_pipeline.tick.certificate import certify
from market_pipeline.warehouse.decisions import DecisionAction


def warm_target(tick: Tick, freeing: int = 0) -> int:
    """Standby nodes to keep, bounded by the fleet's physical nodes not in service.

    `freeing`: nodes about to be powered off besides those already decided this tick.
    """
    share = warm_share(tick.config)
    shortfall = tick.target.floor_nodes - tick.in_service
    wanted = math.ceil(shortfall / share - 1e-9) if share > 0 and shortfall > 0 else 0
    # a return to the recent peak resumes warm nodes (a minute) instead of booting cold ones
    # (a cold boot outlasts the tick, and the price shield prices the gap meanwhile)
    coming = sum(
        d.count
        for d in tick.decisions
        if d.allowed
        and (d.action == DecisionAction.SCALE_UP or (d.action == DecisionAction.POWER_ON and d.node_id))
    )  # entering service now
    peak = tick.target.peak_nodes - tick.in_service - coming if tick.config.warm_to_recent_peak else 0
    fleet = fleet_reserve_nodes(tick) - tick.in_service - coming
    # nodes powered off this tick free their slots: on a full fleet they go straight to
    # standby instead of powering fully off while a cold node boots to refill the pool
    leaving = freeing + _powered_off(tick)
    spare = tick.pool_state.max_nodes - tick.fleet.powered + leaving
    return max(0, min(spare, max(tick.config.warm_pool_nodes, wanted, peak, fleet)))


def fleet_reserve_nodes(tick: Tick) -> int:
    """Nodes in service or standby whatever the recent peaks say: `warm_reserve_fleet_fraction`
    of the pool's nodes. The recent peak forgets, and a first job larger than any it saw (Helios
    vcMod: 0 to 64 GPUs after a week below 25) found one node in service and four warm, so cold
    boots that serve none of the tick had to carry it and the certificate failed."""
    return math.ceil(tick.config.warm_reserve_fleet_fraction * tick.pool_state.max_nodes - 1e-9)


def power_off_target(tick: Tick) -> str:
    """A removed node refills the warm pool first, then powers fully off."""
    return (
        "standby"
        if tick.fleet.warm_stock + _powered_off(tick, "standby") < warm_target(tick, freeing=1)
        else "off"
    )


def _powered_off(tick: Tick, into: str | None = None) -> int:
    """Nodes this tick has decided to power off (into standby, or off, when `into` is set)."""
    return sum(
        1
        for d in tick.decisions
        if d.allowed
        and d.action == DecisionAction.SCALE_DOWN
        and d.node_id
        and (into is None or d.inputs.to == into)
    )


def stock_warm_pool(tick: Tick) -> None:
    """Boot cold nodes into standby while the warm pool is below its target."""
    resumed = sum(
        1 for d in tick.decisions if d.allowed and d.action == DecisionAction.POWER_ON and d.node_id
    )
    cold_started = sum(d.count for d in tick.decisions if d.allowed and d.action == DecisionAction.SCALE_UP)
    stock = tick.fleet.warm_stock - resumed + _powered_off(tick, "standby")  # parked this tick: already stock
    target = warm_target(tick)
    physical_free = tick.pool_state.max_nodes - tick.fleet.powered - tick.fleet.warm_stock - cold_started
    count = min(target - stock, physical_free)
    if count > 0:
        tick.add(
            DecisionAction.POWER_ON,
            None,
            True,
            [
                Why(
                    ScalingReason.PREWARM,
                    f"warm pool {stock} < {target} node(s) (keeps a typical recent peak "
                    f"drainable at price_max with {tick.in_service} in service)",
                ),
            ],
            count=count,
            to="standby",
        )


def trim_warm_pool(tick: Tick) -> None:
    """Power standby nodes fully off only beyond what an empty pool would want warm.

    Trimming to the moving target would churn: the target falls when nodes enter service
    and rises when they leave, so the pool keeps its high-water mark up to that bound.
    """
    share = warm_share(tick.config)
    ceiling = max(
        tick.config.warm_pool_nodes, math.ceil(tick.target.floor_nodes / share - 1e-9) if share > 0 else 0
    )
    if tick.config.warm_to_recent_peak:
        ceiling = max(ceiling, tick.target.peak_nodes)
    ceiling = max(ceiling, fleet_reserve_nodes(tick))
    resuming = {d.node_id for d in tick.decisions if d.action == DecisionAction.POWER_ON and d.node_id}
    spare = [n for n in sorted(tick.fleet.standby, key=lambda n: n.node_id) if n.node_id not in resuming]
    excess = len(spare) + len(tick.fleet.warming) - ceiling
    for node in spare[: max(0, excess)]:
        tick.add(
            DecisionAction.POWER_OFF,
            node.node_id,
            True,
            [f"warm pool above {ceiling} node(s): power fully off"],
        )


def interval_resumes(tick: Tick, resumed: list[NodeView], spare: list[NodeView]) -> int:
    """Extra warm nodes so that the capacity serving over this tick certifies, not only the count.

    A resumed node serves only `warm_share` of the tick; sized by node count alone, the
    price shield would price the gap for the whole tick (turning away a share of *all*
    demand), which costs more unserved GPU-minutes than the node's extra minutes cost idle.
    """
    if not tick.config.cover_interval_on_scale_up or not spare:
        return 0
    config, g = tick.config, tick.pool_state.node_gpus
    share = warm_share(config)
    serving = serving_capacity_gpus([*tick.fleet.schedulable, *tick.fleet.booting], tick.now, config)
    serving += tick.uncordoned * g + sum(n.gpus for n in resumed) * share
    extra = 0
    while extra < len(spare) and share > 0:
        state = backlog_state(tick.pool_state, tick.forecast_q90, tick.price, serving)
        if certify(state, tick.price, serving, config.backlog).admissible:
            break
        serving += spare[extra].gpus * share
        extra += 1
    return extra
