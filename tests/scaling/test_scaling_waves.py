"""plan_pool: scale-down waves powered off together, warm resumes sized for the tick, warm reserve."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from scaling_testkit import T0, allowed, policy_config

from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import (
    DrainStatus,
    NodeState,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
)

# one busy node drains at a time (budget 1% of the pool rounds up to one node)
CONFIG = policy_config(
    hysteresis_minutes=10.0,
    scale_up_cooldown_minutes=0.0,
    disruption_budget_pct=1.0,
    scale_down_wave_minutes=30.0,
)


def plan(demand, node_list, memory, minute, drains=None, config=CONFIG):
    state = PoolState("pool", node_gpus=8, max_nodes=20, demand_gpus=demand, gpu_hour_cost=1.2)
    return plan_pool(
        state, demand, 1.0, node_list, drains or {}, config, T0 + dt.timedelta(minutes=minute), memory=memory
    )


def fleet(cordoned: set[str], off: set[str] = frozenset(), used: float = 2.0) -> list[NodeView]:
    return [
        NodeView(f"a{i}", NodeState.CORDONED if f"a{i}" in cordoned else NodeState.ACTIVE, 8, used)
        for i in range(5)
        if f"a{i}" not in off
    ]


def drive_waves(config: ScalingConfig) -> list[list[str]]:
    """Demand 10 GPUs on 5 busy nodes (need 2): return the nodes powered off at each tick."""
    memory, cordoned, off, offs = ScalerMemory("pool"), set(), set(), []
    for minute in range(0, 60, 5):
        drains = {n: DrainStatus(n, True) for n in cordoned}
        decisions = plan(10.0, fleet(cordoned, off), memory, minute, drains, config)
        gone = [d.node_id for d in allowed(decisions, "scale_down")]
        offs.append(gone)
        off |= set(gone)
        cordoned = (cordoned - set(gone)) | {d.node_id for d in allowed(decisions, "cordon")}
        assert len([d for d in allowed(decisions, "cordon")]) <= 1  # the budget: one busy drain at once
    return offs


def test_drained_nodes_wait_for_the_next_wave_and_go_in_one_action() -> None:
    offs = drive_waves(CONFIG)
    assert sorted(n for tick in offs for n in tick) == ["a0", "a1", "a2"]
    assert sum(1 for tick in offs if tick) == 1  # three nodes, one scale-down action


def test_without_waves_each_busy_drain_is_its_own_action() -> None:
    offs = drive_waves(dataclasses.replace(CONFIG, scale_down_wave_minutes=0.0))
    assert sum(1 for tick in offs if tick) == 3


def test_a_wave_is_bounded_in_time() -> None:
    offs = drive_waves(dataclasses.replace(CONFIG, scale_down_wave_minutes=6.0))
    assert sum(1 for tick in offs if tick) >= 2  # a held node waits at most one more wave


def test_a_held_drained_node_is_the_first_taken_back_when_demand_returns() -> None:
    memory = ScalerMemory("pool")
    plan(10.0, fleet(set()), memory, 0)
    first = allowed(plan(10.0, fleet(set()), memory, 20), "cordon")[0].node_id  # saves more than it costs
    drains = {first: DrainStatus(first, True)}
    second = allowed(plan(10.0, fleet({first}), memory, 25, drains), "cordon")[0].node_id
    assert first in memory.draining  # held, not powered off
    back = plan(34.0, fleet({first, second}), memory, 30, {first: DrainStatus(first, True)})
    assert {d.node_id for d in allowed(back, "uncordon")} == {first, second}
    assert not allowed(back, "scale_down")


def test_warm_resumes_cover_the_tick_not_only_the_node_count() -> None:
    # 60 GPUs certify at 64 (8 nodes); a resumed node serves 4 of the 5 minutes, so four
    # resumes leave the tick short (32 + 4 x 6.4 < 63.2) and a fifth is resumed
    node_list = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 8.0) for i in range(4)]
    node_list += [NodeView(f"s{i}", NodeState.STANDBY, 8) for i in range(6)]
    config = dataclasses.replace(CONFIG, warm_resume_minutes=1.0)
    covered = plan(60.0, node_list, ScalerMemory("pool"), 0, config=config)
    counted = plan(
        60.0,
        node_list,
        ScalerMemory("pool"),
        0,
        config=dataclasses.replace(config, cover_interval_on_scale_up=False),
    )
    assert len([d for d in allowed(covered, "power_on") if d.node_id]) == 5
    assert len([d for d in allowed(counted, "power_on") if d.node_id]) == 4


def test_warm_pool_holds_a_return_to_the_recent_peak() -> None:
    config = dataclasses.replace(CONFIG, keep_window_hours=12.0, keep_band_fraction=0.0)
    for reserve, expected in ((True, 6), (False, 0)):
        memory = ScalerMemory("pool")
        busy = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 7.5) for i in range(8)]
        plan(60.0, busy, memory, 0, config=dataclasses.replace(config, warm_to_recent_peak=reserve))
        lull = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 6.0) for i in range(2)]
        decisions = plan(
            12.0, lull, memory, 5, config=dataclasses.replace(config, warm_to_recent_peak=reserve)
        )
        prewarm = [d for d in allowed(decisions, "power_on") if d.inputs.to == "standby"]
        assert sum(d.count for d in prewarm) == expected  # 60 GPUs need 8 nodes, 2 are in service


def test_warm_reserve_holds_the_largest_recent_rise_above_the_peak() -> None:
    """A new peak arrives as a jump between ticks; within the max price step only nodes that
    resume inside the tick keep it drainable, so the reserve holds one recent rise more."""
    config = dataclasses.replace(CONFIG, keep_window_hours=12.0, keep_band_fraction=0.0)
    memory = ScalerMemory("pool")
    for minute, demand in enumerate([20.0, 44.0, 36.0]):  # a rise of 24 GPUs, then a fall of 8
        plan(
            demand,
            [NodeView(f"a{i}", NodeState.ACTIVE, 8, 6.0) for i in range(7)],
            memory,
            5 * minute,
            config=config,
        )
    assert memory.demand_rises == [24.0]  # falls are no rises
    lull = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 6.0) for i in range(2)]
    decisions = plan(12.0, lull, memory, 15, config=config)
    prewarm = sum(d.count for d in allowed(decisions, "power_on") if d.inputs.to == "standby")
    without = plan(12.0, lull, dataclasses.replace(memory, demand_rises=[]), 15, config=config)
    peak_only = sum(d.count for d in allowed(without, "power_on") if d.inputs.to == "standby")
    # 44 GPUs of peak certify at 6 nodes (4 warm beyond the 2 in service); 68 at 9 (7 warm)
    assert (peak_only, prewarm) == (4, 7)


@pytest.mark.parametrize("max_nodes", [5, 8])  # a full fleet, and one with room to boot
def test_nodes_powered_off_refill_the_warm_pool_instead_of_cold_boots(max_nodes: int) -> None:
    """Slots freed this tick count, and so do nodes parked in standby this tick."""
    config = dataclasses.replace(
        CONFIG, keep_window_hours=12.0, keep_band_fraction=0.0, keep_band_step_changes=0, warm_pool_nodes=1
    )
    memory = ScalerMemory("pool")
    full = PoolState("pool", node_gpus=8, max_nodes=max_nodes, demand_gpus=38.0, gpu_hour_cost=1.2)
    busy = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 7.6) for i in range(5)]
    plan_pool(full, 38.0, 1.0, busy, {}, config, T0, memory=memory)  # the peak the reserve returns to
    memory.draining = {"a3": T0.timestamp(), "a4": T0.timestamp()}
    lull = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 6.0) for i in range(3)] + [
        NodeView(f"a{i}", NodeState.CORDONED, 8, 0.0) for i in (3, 4)
    ]
    state = dataclasses.replace(full, demand_gpus=18.0)
    decisions = plan_pool(state, 18.0, 1.0, lull, {}, config, T0 + dt.timedelta(minutes=5), memory=memory)
    off = allowed(decisions, "scale_down")
    assert sorted(d.node_id for d in off) == ["a3", "a4"]
    assert {d.inputs.to for d in off} == {"standby"}
    assert not allowed(decisions, "power_on")  # no cold boot refills what the removals just filled
