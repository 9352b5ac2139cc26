"""Property-based checks of the policy driving the simulated fleet (hypothesis).

- never below certified capacity: a tick that takes capacity out of service leaves the
  equilibrium price certified for the forecast it planned with;
- never over budget: busy drains per tick and per hour stay within the disruption budget;
- no flapping: a noisy but level load costs a bounded number of scaling actions per day;
- a demand step is answered (capacity certifies it at the equilibrium price) within a
  bounded number of ticks.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from market_pipeline.lab.scaling.fleet_sim import FleetParams
from market_pipeline.lab.scaling.forecast import CausalQuantileForecaster
from market_pipeline.lab.scaling.replay import PolicyRun, ReplaySettings
from market_pipeline.scaling.capacity import backlog_state
from market_pipeline.scaling.types import NodeState, ScalingConfig
from market_pipeline.tick.certificate import BacklogParams, certify

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
TICK = 5
CONFIG = ScalingConfig(
    backlog=BacklogParams(price_min=0.5, price_max=3.75), scale_up_persistence_minutes=30.0
)


def make_run(
    level: float, seed: int, config: ScalingConfig = CONFIG, max_nodes: int | None = None
) -> PolicyRun:
    initial = max(1, math.ceil(level / 8))
    fleet = FleetParams(max_nodes=max_nodes or 2 * initial + 6, warm_nodes=1, seed=seed, pin_probability=0.2)
    settings = ReplaySettings(fleet=fleet, scaling=config, tick_minutes=TICK, forecast_horizon_minutes=TICK)
    return PolicyRun(settings, initial, T0)


def drive(run: PolicyRun, demand: np.ndarray, on_tick=None) -> None:
    forecaster = CausalQuantileForecaster(TICK, 0.9)
    for minute, value in enumerate(demand):
        run.fleet.advance(minute)
        if minute % TICK == 0:
            observed = float(demand[max(minute - 1, 0)])
            q90 = forecaster.forecast() if minute else observed
            run.tick(minute, observed, q90)
            if on_tick is not None:
                on_tick(minute, q90)
        run.serve(minute, float(value))
        forecaster.observe(float(value))


def in_service_gpus(run: PolicyRun) -> float:
    return sum(n.gpus for n in run.fleet.nodes if n.state in (NodeState.ACTIVE, NodeState.BOOTING))


def noisy_path(seed: int, level: float, noise: float, minutes: int, jumps: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    path = level + rng.normal(0.0, noise * level, minutes)
    for _ in range(jumps):  # a few level shifts, up or down
        start = int(rng.integers(0, minutes))
        path[start:] += rng.uniform(-0.5, 0.8) * level
    return np.clip(np.round(path), 0.0, None)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.floats(8.0, 120.0), st.floats(0.0, 0.3), st.integers(0, 4))
def test_scaling_never_below_certified_capacity(seed: int, level: float, noise: float, jumps: int) -> None:
    run = make_run(level, seed)
    demand = noisy_path(seed, level, noise, 1440, jumps)

    def check(minute: int, q90: float) -> None:
        removing = [d for d in run.last_decisions if d.allowed and d.action in ("cordon", "scale_down")]
        if not removing or run.last_state is None:
            return
        left = in_service_gpus(run)
        state = backlog_state(run.last_state, q90, 1.0, left)
        assert certify(state, 1.0, left, run.config.backlog).admissible, (minute, left, q90)

    drive(run, demand, check)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.floats(16.0, 120.0), st.floats(0.05, 0.4), st.integers(1, 5))
def test_scaling_never_over_budget(seed: int, level: float, noise: float, jumps: int) -> None:
    config = ScalingConfig(
        backlog=CONFIG.backlog,
        scale_up_persistence_minutes=30.0,
        disruption_budget_pct=20.0,
        max_removals_per_hour=3,
        hysteresis_minutes=10.0,
    )
    run = make_run(level, seed, config)
    busy_starts: list[int] = []

    def check(minute: int, q90: float) -> None:
        busy = [
            d
            for d in run.last_decisions
            if d.allowed and d.action == "cordon" and d.inputs.used_gpus or 0 > 0
        ]
        pool_nodes = sum(
            1 for n in run.fleet.nodes if n.state in (NodeState.ACTIVE, NodeState.BOOTING, NodeState.CORDONED)
        )
        assert len(busy) <= max(1, math.ceil(0.2 * pool_nodes))
        busy_starts.extend([minute] * len(busy))
        assert sum(1 for m in busy_starts if minute - m < 60) <= 3

    drive(run, noisy_path(seed, level, noise, 1440, jumps), check)


# Noise up to 5%: the property the README states. Above it the policy follows the rarest
# peaks on small pools near a node boundary (README: 3 of 56 sampled loads at 5-7.5% noise and
# 7 of 30 at 7.5-10% take more than 8 actions in two days; e.g. seed 0, 20 GPUs, 9.4% noise
# takes 14), so a draw up to 10% passed or failed by which examples Hypothesis happened to try.
@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000), st.floats(16.0, 160.0), st.floats(0.0, 0.05))
def test_no_flapping_under_a_noisy_level_load(seed: int, level: float, noise: float) -> None:
    # a level of at least two nodes, minute-to-minute noise up to 5% (peaks near +15%)
    run = make_run(level, seed)
    demand = noisy_path(seed, level, noise, 2 * 1440)
    first_day: list[int] = []

    def count(minute: int, q90: float) -> None:
        if minute == 1440:
            first_day.append(run.metrics.scale_up_events + run.metrics.scale_down_events)

    drive(run, demand, count)
    total = run.metrics.scale_up_events + run.metrics.scale_down_events
    assert total <= 8, total  # settling in from the initial size included
    assert total - first_day[0] <= 3  # once settled: at most three actions a day


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000), st.floats(16.0, 80.0), st.floats(0.2, 1.5))
def test_demand_step_is_answered_within_bounded_ticks(seed: int, level: float, step: float) -> None:
    run = make_run(level, seed, max_nodes=int(2 * level * (1 + step) / 8) + 8)
    step_at = 180
    high = level * (1 + step)
    demand = np.concatenate([np.full(step_at, level), np.full(240, high)])
    answered: list[int] = []
    needed = math.ceil(high / (0.95 * 8))  # certified at the equilibrium price, 5% drift margin

    def check(minute: int, q90: float) -> None:
        if (
            minute > step_at
            and not answered
            and in_service_gpus(run) >= needed * 8
            and run.price_ratio == 1.0
        ):
            answered.append(minute)

    drive(run, demand, check)
    bound = run.config.scale_up_persistence_minutes + run.settings.fleet.cold_delay_minutes + 3 * TICK
    assert answered, "the step was never answered"
    assert answered[0] - step_at <= bound
