"""Replay a per-minute demand trace through the scaling policy and through the baseline.

Every control tick (`tick_minutes`, the live loop's tick) the policy sees the previous
minute (demand, pending) and the causal forecast made then, and calls the same `plan_pool`
and market tick as the live loop; its allowed decisions are executed on the fluid fleet
(`fleet_sim`), and the market tick's price (`tick.run_market_tick`: the list price, shielded
inside the promises at the capacity serving the tick) holds until the next tick. The baseline runs its own
rules every minute (cluster-autoscaler scans every 10 s) on an identical fleet without a
warm pool, at the reference price. Demand, pending and idle are counted per minute.
Demand in the trace is read as demand at the reference price; a raised price sheds the
delay-sensitive part by the guardrail's own demand curve, the residual floor stays.

Accounting: every GPU of trace demand (running + pending) wanted service that minute, so
`pending_gpu_minutes` is the *unserved* demand, `demand - served`, summed per minute: the
part that queued (`queued_gpu_minutes`) plus the part the policy's price turned away
(`priced_out_gpu_minutes`). The baseline keeps the reference price and prices nothing out,
so both runs are compared on the same quantity; a policy cannot look better by shedding
demand through price instead of serving it.
Both runs are scored with the same certificate at the same ticks: a violation is a tick
whose applied (price, capacity serving over the tick) had non-negative backlog drift. An
action is a minute in which the pool grew, or shrank, by any number of nodes (the
baseline removes non-empty nodes one at a time, so each of its removals is one); node
power changes, priced-out demand and standby GPU-hours are reported next to them.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field, replace

import numpy as np

from market_pipeline.lab.scaling.baseline import AutoscalerParams, ClusterAutoscalerBaseline
from market_pipeline.lab.scaling.fleet_sim import Fleet, FleetParams
from market_pipeline.lab.scaling.forecast import CausalQuantileForecaster, causal_forecast_series
from market_pipeline.scaling.capacity import backlog_state, serving_capacity_gpus
from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import (
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingDecision,
    ScalingReason,
)
from market_pipeline.tick import PoolTickInput, Promises, guaranteed_window, run_market_tick
from market_pipeline.tick.certificate import Certificate, certify
from market_pipeline.warehouse.decisions import DecisionAction


@dataclass(frozen=True)
class DemandLoad:
    demand: np.ndarray  # GPUs wanted per minute at the reference price
    start: dt.datetime
    initial_gpus: int
    source: str = ""
    total_gpus: np.ndarray | None = None  # the trace's own capacity per minute, if known

    def window(self, first_minute: int, end_minute: int) -> DemandLoad:
        """Minutes [first, end) as a load of its own, starting at the trace's capacity then."""
        if not 0 <= first_minute < end_minute <= self.demand.size:
            raise ValueError(
                f"window: need 0 <= first < end <= {self.demand.size}, got [{first_minute}, {end_minute})"
            )
        initial = self.initial_gpus if self.total_gpus is None else int(self.total_gpus[first_minute])
        return DemandLoad(
            demand=self.demand[first_minute:end_minute],
            start=self.start + dt.timedelta(minutes=first_minute),
            initial_gpus=max(1, initial),
            source=f"{self.source}[{first_minute}:{end_minute}]",
            total_gpus=None if self.total_gpus is None else self.total_gpus[first_minute:end_minute],
        )


UNCAPPED = 10.0  # the largest guaranteed cap the config accepts


@dataclass(frozen=True)
class ReplaySettings:
    fleet: FleetParams = field(default_factory=FleetParams)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    baseline: AutoscalerParams = field(default_factory=AutoscalerParams)
    reference_price: float = 1.0
    gpu_hour_cost: float = 1.0
    tick_minutes: int = 5  # the policy's control tick (the baseline acts every minute)
    forecast_horizon_minutes: int = 5
    forecast_quantile: float = 0.9
    forecast_statistic: str = "mean"
    pool: str = "replay"
    # the config's max step and band; the guaranteed cap does not bind the replay's one price
    # (`lab.scaling.replay_options.replay_promises`): its bounds are the pool's price_min..price_max
    promises: Promises = field(default_factory=lambda: Promises(guaranteed_cap=UNCAPPED))


@dataclass
class ReplayMetrics:
    minutes: int = 0
    idle_gpu_minutes: float = 0.0
    pending_gpu_minutes: float = 0.0  # unserved: queued + priced out
    queued_gpu_minutes: float = 0.0
    priced_out_gpu_minutes: float = 0.0
    powered_gpu_minutes: float = 0.0
    standby_gpu_minutes: float = 0.0
    ticks: int = 0
    certificate_violations: int = 0
    uncertified_ticks: int = 0
    price_raised_minutes: int = 0
    max_price_ratio: float = 1.0
    scale_up_events: int = 0
    scale_down_events: int = 0
    removals: int = 0
    blocked_drain_nodes: set[str] = field(default_factory=set)

    def record_minute(
        self, fleet: Fleet, demand: float, realized: float, served: float, price_ratio: float
    ) -> None:
        self.minutes += 1
        powered = fleet.powered_gpus()
        self.powered_gpu_minutes += powered
        self.standby_gpu_minutes += fleet.standby_gpus()
        self.idle_gpu_minutes += max(0.0, powered - served)
        queued = max(0.0, realized - served)
        priced_out = max(0.0, demand - realized)
        self.queued_gpu_minutes += queued
        self.priced_out_gpu_minutes += priced_out
        self.pending_gpu_minutes += queued + priced_out
        self.price_raised_minutes += int(price_ratio > 1.0 + 1e-9)
        self.max_price_ratio = max(self.max_price_ratio, price_ratio)

    def record_tick(self, cert: Certificate) -> None:
        self.ticks += 1
        self.certificate_violations += int(cert.drift >= 0)
        self.uncertified_ticks += int(not cert.admissible)

    def summary(self, fleet: Fleet) -> dict[str, float | int]:
        days = max(self.minutes, 1) / 1440.0
        c = fleet.counters
        return {
            "idle_gpu_hours": round(self.idle_gpu_minutes / 60.0, 2),
            "pending_gpu_minutes": round(self.pending_gpu_minutes, 2),
            "actions_per_day": round((self.scale_up_events + self.scale_down_events) / days, 3),
            "certificate_violations": self.certificate_violations,
            "queued_gpu_minutes": round(self.queued_gpu_minutes, 2),
            "priced_out_gpu_minutes": round(self.priced_out_gpu_minutes, 2),
            "uncertified_ticks": self.uncertified_ticks,
            "ticks": self.ticks,
            "price_raised_minutes": self.price_raised_minutes,
            "max_price_ratio": round(self.max_price_ratio, 4),
            "mean_powered_gpus": round(self.powered_gpu_minutes / max(self.minutes, 1), 2),
            "standby_gpu_hours": round(self.standby_gpu_minutes / 60.0, 2),
            "scale_up_events": self.scale_up_events,
            "scale_down_events": self.scale_down_events,
            "removals": self.removals,
            "node_power_changes_per_day": round(c.node_power_changes / days, 3),
            "drains_started": c.drains_started,
            "drains_blocked": c.drains_blocked,
            "migrated_gpus": round(c.migrated_gpus, 2),
            "blocked_drain_nodes_reported": len(self.blocked_drain_nodes),
            "minutes": self.minutes,
        }


def demand_factor(price_ratio: float, config: ScalingConfig) -> float:
    """Share of reference-price demand that stays at `price_ratio` x the reference price."""
    share = config.backlog.residual_share
    return share + (1.0 - share) * price_ratio ** (-config.backlog.elasticity)


def forecast_series(load: DemandLoad, settings: ReplaySettings) -> np.ndarray:
    forecaster = CausalQuantileForecaster(
        settings.forecast_horizon_minutes, settings.forecast_quantile, statistic=settings.forecast_statistic
    )
    return causal_forecast_series(load.demand, forecaster)


def _pool_state(load: DemandLoad, settings: ReplaySettings, minute: int, pending_prev: float) -> PoolState:
    observed = float(load.demand[max(minute - 1, 0)])
    return PoolState(
        pool=settings.pool,
        node_gpus=settings.fleet.node_gpus,
        max_nodes=settings.fleet.max_nodes,
        demand_gpus=observed,
        backlog_gpus=pending_prev,
        gpu_hour_cost=settings.gpu_hour_cost,
    )


def _initial_nodes(load: DemandLoad, settings: ReplaySettings) -> int:
    """The fleet both runs start with: the trace's capacity at its first minute, or what that
    minute's demand needs where the trace starts overloaded (Helios vcpDC: 85 GPUs wanted on
    56). A backlog the replay inherits at minute 0 is no decision of either run, and the
    certificate of the first tick would score it as one."""
    first = float(load.demand[0]) if load.demand.size else 0.0
    gpus = max(float(load.initial_gpus), first)
    return min(settings.fleet.max_nodes, max(1, math.ceil(gpus / settings.fleet.node_gpus - 1e-9)))


class PolicyRun:
    """The policy driving a simulated fleet: `tick()` at control ticks, `serve()` each minute."""

    def __init__(self, settings: ReplaySettings, initial_nodes: int, start: dt.datetime) -> None:
        self.settings = settings
        self.config = replace(settings.scaling, interval_minutes=float(settings.tick_minutes))
        self.fleet = Fleet(settings.fleet, initial_nodes)
        self.memory = ScalerMemory(pool=settings.pool)
        self.metrics = ReplayMetrics()
        self.start = start
        self.price_ratio = 1.0
        self.pending = 0.0
        self.last_decisions: list[ScalingDecision] = []
        self.last_state: PoolState | None = None

    def tick(self, minute: int, observed_demand: float, forecast_q90: float) -> Certificate:
        """Plan, execute the allowed decisions, shield the price; return the applied certificate."""
        s = self.settings
        now = self.start + dt.timedelta(minutes=minute)
        window = guaranteed_window(
            s.reference_price * self.price_ratio,
            s.reference_price,
            self.config.backlog.price_min,
            self.config.backlog.price_max,
            s.promises,
        )
        state = PoolState(
            pool=s.pool,
            node_gpus=s.fleet.node_gpus,
            max_nodes=s.fleet.max_nodes,
            demand_gpus=observed_demand,
            backlog_gpus=self.pending,
            gpu_hour_cost=s.gpu_hour_cost,
            price_ceiling=window.high,
        )
        self.last_state = state
        views = self.fleet.node_views(self.start, minute)
        pref = s.reference_price
        self.last_decisions = plan_pool(
            state,
            forecast_q90,
            pref,
            views,
            self.fleet.drain_status(minute),
            self.config,
            now,
            memory=self.memory,
        )
        if execute_decisions(self.fleet, self.last_decisions, minute, self.metrics):
            views = self.fleet.node_views(self.start, minute)
        serving = serving_capacity_gpus(views, now, self.config)
        tick = run_market_tick([self._tick_input(state, forecast_q90, serving)], None, s.promises)
        self.price_ratio = tick.pools[0].guaranteed / pref
        cert = certify(
            backlog_state(state, forecast_q90, pref, serving),
            tick.pools[0].guaranteed,
            serving,
            self.config.backlog,
        )
        self.metrics.record_tick(cert)
        return cert

    def _tick_input(self, state: PoolState, forecast_q90: float, serving: float) -> PoolTickInput:
        """The replay's pool for the market tick: no tenants (the trace is demand at the
        reference price, which is its list price), the price in force, the serving capacity."""
        s, pref = self.settings, self.settings.reference_price
        price = pref * self.price_ratio
        mid = 1 - s.promises.band_mid()
        return PoolTickInput(
            pool_id=s.pool,
            list_price=pref,
            price_min=self.config.backlog.price_min,
            price_max=self.config.backlog.price_max,
            node_gpus=float(s.fleet.node_gpus),
            serving_gpus=serving,
            reachable_gpus=float(s.fleet.max_nodes * s.fleet.node_gpus),
            demand_gpus=state.demand_gpus,
            backlog_gpus=state.backlog_gpus,
            forecast_upper_gpus=forecast_q90,
            in_force_guaranteed=price,
            in_force_drainable=price * mid,
            forecast_price=pref,
            backlog=self.config.backlog,
        )

    def serve(self, minute: int, demand: float) -> float:
        """One minute of reference-price `demand` at the current price; return GPUs served."""
        realized = demand * demand_factor(self.price_ratio, self.config)
        served = self.fleet.place(realized, minute)
        self.metrics.record_minute(self.fleet, demand, realized, served, self.price_ratio)
        self.pending = realized - served
        return served


def replay_policy(
    load: DemandLoad, settings: ReplaySettings, forecasts: np.ndarray | None = None
) -> dict[str, float | int]:
    fc = forecast_series(load, settings) if forecasts is None else forecasts
    run = PolicyRun(settings, _initial_nodes(load, settings), load.start)
    for minute in range(load.demand.size):
        run.fleet.advance(minute)
        if minute % settings.tick_minutes == 0:
            observed = float(load.demand[max(minute - 1, 0)])
            run.tick(minute, observed, float(fc[minute - 1]) if minute > 0 else observed)
        run.serve(minute, float(load.demand[minute]))
    return run.metrics.summary(run.fleet)


def execute_decisions(
    fleet: Fleet, decisions: list[ScalingDecision], minute: int, metrics: ReplayMetrics
) -> bool:
    """Carry out the allowed decisions; return whether any node changed state."""
    scaled_up = scaled_down = changed = False
    for d in decisions:
        if ScalingReason.BLOCKED_DRAIN in d.codes and d.node_id is not None:
            metrics.blocked_drain_nodes.add(d.node_id)
        if not d.allowed or d.action == DecisionAction.HOLD:
            continue
        changed = True
        if d.action == DecisionAction.SCALE_UP:
            scaled_up |= fleet.power_on_cold(d.count, minute) > 0
        elif d.action == DecisionAction.POWER_ON and d.node_id:
            scaled_up |= fleet.power_on_warm(d.node_id, minute)
        elif d.action == DecisionAction.POWER_ON:
            fleet.power_on_cold(d.count, minute, to_standby=d.inputs.to == "standby")
        elif d.action in (DecisionAction.CORDON, DecisionAction.REPLACE) and d.node_id:
            fleet.cordon(d.node_id, minute)
        elif d.action == DecisionAction.UNCORDON and d.node_id:
            fleet.uncordon(d.node_id)
        elif d.action == DecisionAction.SCALE_DOWN and d.node_id:
            if fleet.power_off(d.node_id, to_standby=d.inputs.to == "standby"):
                metrics.removals += 1
                scaled_down = True
        elif d.action == DecisionAction.POWER_OFF and d.node_id:
            fleet.power_off(d.node_id, to_standby=False)
    metrics.scale_up_events += int(scaled_up)
    metrics.scale_down_events += int(scaled_down)
    return changed


def replay_baseline(
    load: DemandLoad, settings: ReplaySettings, forecasts: np.ndarray | None = None
) -> dict[str, float | int]:
    fc = forecast_series(load, settings) if forecasts is None else forecasts
    config = replace(settings.scaling, interval_minutes=float(settings.tick_minutes))
    fleet = Fleet(replace(settings.fleet, warm_nodes=0), _initial_nodes(load, settings))
    scaler = ClusterAutoscalerBaseline(settings.baseline)
    metrics = ReplayMetrics()
    served_prev = pending_prev = 0.0
    pref = settings.reference_price
    for minute in range(load.demand.size):
        fleet.advance(minute)
        outcome = scaler.step(fleet, minute, served_prev, pending_prev)
        metrics.scale_up_events += outcome.scale_up_events
        metrics.scale_down_events += int(outcome.removals > 0)
        metrics.removals += outcome.removals
        if minute % settings.tick_minutes == 0:
            # scored by the same certificate at the policy's ticks, at the reference price
            now = load.start + dt.timedelta(minutes=minute)
            state = _pool_state(load, settings, minute, pending_prev)
            q90 = float(fc[minute - 1]) if minute > 0 else state.demand_gpus
            serving = serving_capacity_gpus(fleet.node_views(load.start, minute), now, config)
            metrics.record_tick(
                certify(backlog_state(state, q90, pref, serving), pref, serving, config.backlog)
            )
        demand = float(load.demand[minute])
        served = fleet.place(demand, minute)
        metrics.record_minute(fleet, demand, demand, served, 1.0)
        served_prev, pending_prev = served, demand - served
    return metrics.summary(fleet)
