"""Capacity arithmetic shared by the planner, the price shield and the replay.

Pricing handles transient imbalance, scaling handles trends (a price answers within a tick,
a node takes minutes and costs money to add or remove, so only a lasting gap is scaled): the planner
sizes the pool so that the *equilibrium* price is certified, while the market tick
(`tick.run_market_tick`) shields the price of the current interval against the capacity
that is serving right now (`serving_capacity_gpus`).
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from dataclasses import dataclass

from market_pipeline.scaling.types import (
    NodeState,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingError,
    as_utc,
)
from market_pipeline.tick.certificate import (
    BacklogState,
    PriceCapacityAction,
    ShieldedAction,
    min_certified_capacity,
    shield,
)


@dataclass(frozen=True)
class FleetView:
    """The pool's nodes grouped by what they contribute now."""

    schedulable: tuple[NodeView, ...]  # active and healthy: counted as capacity
    unhealthy: tuple[NodeView, ...]  # active but to be replaced: not counted
    booting: tuple[NodeView, ...]
    cordoned: tuple[NodeView, ...]
    standby: tuple[NodeView, ...]
    warming: tuple[NodeView, ...]
    off: tuple[NodeView, ...]

    @property
    def powered(self) -> int:
        """Nodes that serve or are about to (the warm pool's own boots are not among them)."""
        return len(self.schedulable) + len(self.unhealthy) + len(self.booting) + len(self.cordoned)

    @property
    def warm_stock(self) -> int:
        return len(self.standby) + len(self.warming)

    @property
    def in_service(self) -> int:
        """Nodes the pool counts on: schedulable now or booting."""
        return len(self.schedulable) + len(self.booting)


def fleet_view(nodes: list[NodeView]) -> FleetView:
    groups: dict[str, list[NodeView]] = {name: [] for name in FleetView.__dataclass_fields__}
    for node in nodes:
        if node.state is NodeState.ACTIVE:
            groups["schedulable" if node.healthy else "unhealthy"].append(node)
        else:
            groups[node.state.value].append(node)
    return FleetView(**{name: tuple(items) for name, items in groups.items()})


def demand_basis(pool_state: PoolState, forecast_q90: float) -> float:
    """Plan for the forecast's upper quantile, but never below what is observed now."""
    return max(forecast_q90, pool_state.demand_gpus)


def backlog_state(
    pool_state: PoolState, forecast_q90: float, price: float, max_capacity_gpus: float
) -> BacklogState:
    return BacklogState(
        pool=pool_state.pool,
        demand_forecast_gpus=demand_basis(pool_state, forecast_q90),
        reference_price=price,
        backlog_gpus=pool_state.backlog_gpus,
        max_capacity_gpus=max_capacity_gpus,
        capacity_step_gpus=float(pool_state.node_gpus),
    )


@dataclass(frozen=True)
class CapacityTarget:
    need_nodes: int  # short-term: forecast upper quantile or demand plus headroom, certified
    keep_nodes: int  # recent demand envelope: do not scale down below it
    floor_nodes: int  # nodes (active or warm) that keep a typical recent peak drainable
    wanted_gpus: float
    shielded: ShieldedAction  # the certificate at the short-term need, equilibrium price
    peak_nodes: int = 0  # nodes that certify the warm reserve window's peak at the equilibrium price
    band_nodes: int = 0  # how far above the need the recent peak may hold the pool
    step_gpus: float = 0.0  # the pool's typical demand step, which sized that band
    demand_need_nodes: int = (
        0  # the need at observed demand, without the forecast's rise: the band sits on it
    )

    @property
    def nodes(self) -> int:
        return max(self.need_nodes, self.keep_nodes)


def target_capacity(
    pool_state: PoolState,
    forecast_q90: float,
    price: float,
    config: ScalingConfig,
    envelope: DemandEnvelope | None = None,
    warm_nodes: int = 0,
) -> CapacityTarget:
    """The forecast's upper quantile or demand plus headroom (the larger), raised until certified.

    The recent demand envelope holds capacity up: the pool keeps what certifies the peak of
    the keep window, with the same headroom, at the equilibrium price, but no more than a
    band above the demand's own need with headroom (`keep_band`: a share of the need, so
    that a big pool rides out a dip without churn and a small volatile one does not pay
    for its peaks, or one typical step of the pool's demand, so that a job ending and the
    next starting are no actions); the band and the forecast's rise both cover demand
    returning above now, so the pool keeps the larger of the two, not their sum;
    and never less than what keeps a typical hourly peak of the longer floor window
    drainable at `price_max` — with a residual demand floor, a return of that peak must not
    meet a pool that no price can certify. Warm standby nodes count toward that floor for
    the part of the interval they would serve after resuming. The envelope never forces a
    scale-up on its own.
    """
    _check_forecast(forecast_q90)
    envelope = envelope or DemandEnvelope(0.0, 0.0)
    step = pool_state.node_gpus
    need, wanted, shielded = _need(pool_state, forecast_q90, price, config)
    demand_need = _need(pool_state, pool_state.demand_gpus, price, config)[0]  # no forecast rise
    keep = _certified_nodes(
        pool_state, _need_at(envelope.keep_gpus, config, config.keep_headroom_fraction), price, price, config
    )
    reserve = _certified_nodes(
        pool_state, _need_at(max(envelope.reserve_gpus, envelope.keep_gpus), config), price, price, config
    )
    band = keep_band(need, envelope.step_gpus, step, config)
    floor = _certified_nodes(
        pool_state, envelope.floor_gpus, price, max(price, config.backlog.price_max), config
    )
    # the warm pool carries the floor; nodes stay in service for it only where the fleet
    # cannot hold enough standby nodes (`warm_nodes`: the most the fleet could keep warm)
    active_floor = math.ceil(floor - warm_nodes * warm_share(config) - 1e-9)
    held = max(need, demand_need + band)
    # a dead band on the node boundary: demand hovering one step around it would otherwise add
    # a node at the top of each wobble and remove it at the bottom
    deadband = min(envelope.step_gpus, config.keep_deadband_fraction * step)
    if deadband > 0 and pool_state.demand_gpus > 0:
        held = max(
            held,
            _certified_nodes(
                pool_state, _need_at(pool_state.demand_gpus, config) + deadband, price, price, config
            ),
        )
    keep_nodes = _clamp_nodes(pool_state, max(min(keep, held), active_floor))
    return CapacityTarget(
        need_nodes=need,
        keep_nodes=keep_nodes,
        floor_nodes=floor,
        wanted_gpus=wanted,
        shielded=shielded,
        peak_nodes=_clamp_nodes(pool_state, reserve),
        band_nodes=band,
        step_gpus=envelope.step_gpus,
        demand_need_nodes=demand_need,
    )


def _need(
    pool_state: PoolState, forecast_q90: float, price: float, config: ScalingConfig
) -> tuple[int, float, ShieldedAction]:
    """Nodes for the forecast or demand plus headroom (the larger), raised until certified."""
    # the upper quantile and the headroom both cover forecast error: the larger of the two,
    # not their sum (stacked, a volatile pool held 5% on top of an already wide quantile)
    wanted = max(forecast_q90 + config.headroom_min_gpus, _need_at(pool_state.demand_gpus, config))
    step = pool_state.node_gpus
    wanted_nodes = _clamp_nodes(pool_state, math.ceil(wanted / step - 1e-9))
    state = backlog_state(pool_state, forecast_q90, price, float(pool_state.max_nodes * step))
    shielded = shield(PriceCapacityAction(price, float(wanted_nodes * step)), state, config.backlog)
    certified = max(shielded.capacity_gpus, pool_state.certified_gpus)  # the market tick's target
    need = max(wanted_nodes, _clamp_nodes(pool_state, math.ceil(certified / step - 1e-9)))
    return need, wanted, shielded


def keep_band(need_nodes: int, step_gpus: float, node_gpus: int, config: ScalingConfig) -> int:
    """Nodes the pool may keep above its need: a share of the need, or one typical demand step.

    A pool whose demand moves in whole jobs of 16 GPUs would otherwise remove two nodes
    when a job ends and add them back when the next one starts: two actions a job. The
    band covers the median recent change in demand, but never more than
    `keep_band_max_fraction` of the need (a young pool's first few changes can be its
    largest).
    """
    share = math.floor(need_nodes * config.keep_band_fraction + 1e-9)
    most = math.floor(need_nodes * config.keep_band_max_fraction + 1e-9)
    return max(share, min(math.floor(step_gpus / node_gpus + 1e-9), most))


def _need_at(gpus: float, config: ScalingConfig, extra_fraction: float = 0.0) -> float:
    """GPUs the need asks for at `gpus` of demand, now or at a recent peak (none at none)."""
    if gpus <= 0:
        return 0.0
    return gpus * (1.0 + config.headroom_fraction + extra_fraction) + config.headroom_min_gpus


def warm_share(config: ScalingConfig) -> float:
    """Share of an interval a standby node serves when resumed at its start."""
    return max(0.0, 1.0 - config.warm_resume_minutes / config.interval_minutes)


def _certified_nodes(
    pool_state: PoolState, demand: float, reference_price: float, at_price: float, config: ScalingConfig
) -> int:
    """Nodes that certify `demand` (GPUs wanted at `reference_price`) at `at_price`, no backlog."""
    if demand <= 0:
        return 0
    state = BacklogState(
        pool=pool_state.pool,
        demand_forecast_gpus=demand,
        reference_price=reference_price,
        capacity_step_gpus=float(pool_state.node_gpus),
    )
    return math.ceil(min_certified_capacity(state, at_price, config.backlog) / pool_state.node_gpus - 1e-9)


def _clamp_nodes(pool_state: PoolState, nodes: int) -> int:
    return min(pool_state.max_nodes, max(pool_state.min_nodes, nodes))


@dataclass(frozen=True)
class DemandEnvelope:
    keep_gpus: float  # peak over the keep window: capacity held against churn
    floor_gpus: float  # typical hourly peak over the longer window: must stay drainable at price_max
    reserve_gpus: float = (
        0.0  # peak over the warm reserve window plus the largest recent rise: resumes warm nodes
    )
    step_gpus: float = 0.0  # typical size of a change in demand (one job's GPUs): the least keep band


def record_demand(memory: ScalerMemory, demand: float, t: float, config: ScalingConfig) -> DemandEnvelope:
    """Fold this tick's demand into the hourly peaks and the recent steps; return the envelope."""
    hour = int(t // 3600)
    memory.demand_peaks[hour] = max(memory.demand_peaks.get(hour, 0.0), demand)
    span = max(
        config.keep_window_hours, config.drainable_floor_window_hours, config.warm_reserve_window_hours
    )
    for stale in [h for h in memory.demand_peaks if h < hour - math.ceil(span) + 1]:
        del memory.demand_peaks[stale]

    def peaks(window_hours: float) -> list[float]:
        oldest = hour - math.ceil(window_hours) + 1
        return sorted(v for h, v in memory.demand_peaks.items() if h >= oldest) if window_hours > 0 else []

    keep = peaks(config.keep_window_hours)
    floor = peaks(config.drainable_floor_window_hours)
    # a typical hourly peak (not the rarest spike): what demand returns to after a lull
    typical = floor[min(len(floor) - 1, int(config.drainable_floor_quantile * len(floor)))] if floor else 0.0
    reserve = peaks(config.warm_reserve_window_hours)
    rise = demand - memory.last_demand if memory.last_demand is not None else 0.0
    step = _record_demand_step(memory, demand, config)
    # the warm reserve also holds the largest recent rise between ticks above the window's
    # peak: a new peak arrives as such a jump, and within the max price step only nodes that
    # resume inside the tick (not cold boots) keep it drainable
    jump = _record_demand_rise(memory, rise, config)
    return DemandEnvelope(keep[-1] if keep else 0.0, typical, reserve[-1] + jump if reserve else 0.0, step)


def _record_demand_rise(memory: ScalerMemory, rise: float, config: ScalingConfig) -> float:
    """Fold this tick's rise in demand (if any) into the recent ones; return the largest."""
    if rise > 1e-9:
        memory.demand_rises.append(rise)
    del memory.demand_rises[: max(0, len(memory.demand_rises) - config.keep_band_step_changes)]
    return max(memory.demand_rises, default=0.0)


def _record_demand_step(memory: ScalerMemory, demand: float, config: ScalingConfig) -> float:
    """Fold this tick's change in demand into the recent ones; return their median."""
    if memory.last_demand is not None and abs(demand - memory.last_demand) > 1e-9:
        memory.demand_steps.append(abs(demand - memory.last_demand))
    memory.last_demand = demand
    del memory.demand_steps[: max(0, len(memory.demand_steps) - config.keep_band_step_changes)]
    return statistics.median(memory.demand_steps) if memory.demand_steps else 0.0


def serving_capacity_gpus(nodes: list[NodeView], now: dt.datetime, config: ScalingConfig) -> float:
    """Mean GPUs serving over the coming interval (`interval_minutes`, the control tick).

    Active nodes serve all of it, a cordoned node only its own tasks, a booting node the
    part of the interval after it is ready (a warm node resumed now serves most of a
    5-minute tick; a cold one, none).
    """
    start = as_utc(now)
    interval = config.interval_minutes
    total = 0.0
    for node in nodes:
        if node.state is NodeState.ACTIVE:
            total += node.gpus
        elif node.state is NodeState.CORDONED:
            total += node.used_gpus
        elif node.state is NodeState.BOOTING and node.ready_at is not None:
            ready_in = (as_utc(node.ready_at) - start).total_seconds() / 60.0
            total += node.gpus * min(1.0, max(0.0, (interval - max(ready_in, 0.0)) / interval))
    return total


def _check_forecast(forecast_q90: float) -> None:
    if not (math.isfinite(forecast_q90) and forecast_q90 >= 0):
        raise ScalingError(f"forecast_q90: must be finite and >= 0, got {forecast_q90!r}")
