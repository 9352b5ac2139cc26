"""plan_pool: scale-up order, the five scale-down gates, drains, cool-downs, blocked nodes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from scaling_testkit import T0, allowed, assert_blocked, policy_config

from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import (
    DrainStatus,
    NodeState,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingError,
)

CONFIG = policy_config(
    headroom_fraction=0.0,
    hysteresis_minutes=20.0,
    scale_up_cooldown_minutes=10.0,
    disruption_budget_pct=50.0,
)


def cfg(**changes) -> ScalingConfig:
    return dataclasses.replace(CONFIG, **changes)


def nodes(active: int, used: float = 4.0, standby: int = 0, cordoned: tuple[str, ...] = ()) -> list[NodeView]:
    out = [
        NodeView(f"a{i}", NodeState.CORDONED if f"a{i}" in cordoned else NodeState.ACTIVE, 8, used)
        for i in range(active)
    ]
    return out + [NodeView(f"s{i}", NodeState.STANDBY, 8) for i in range(standby)]


def plan(demand, node_list, memory, minute=0, drains=None, config=CONFIG, forecast=None, max_nodes=20):
    state = PoolState("pool", node_gpus=8, max_nodes=max_nodes, demand_gpus=demand, gpu_hour_cost=1.2)
    return plan_pool(
        state,
        demand if forecast is None else forecast,
        1.0,
        node_list,
        drains or {},
        config,
        T0 + dt.timedelta(minutes=minute),
        memory=memory,
    )


def test_scale_up_takes_the_warm_pool_before_cold_nodes() -> None:
    memory = ScalerMemory("pool")
    decisions = plan(60.0, nodes(4, used=8.0, standby=2), memory)  # 60/0.95 -> 64 GPUs = 8 nodes
    assert [d.node_id for d in allowed(decisions, "power_on")] == ["s0", "s1"]
    cold = allowed(decisions, "scale_up")
    assert len(cold) == 1 and cold[0].count == 2
    assert memory.last_scale_up_at == T0.timestamp()


def test_scale_up_stops_at_max_nodes_and_says_so() -> None:
    decisions = plan(60.0, nodes(4, used=8.0), ScalerMemory("pool"), max_nodes=5)
    assert allowed(decisions, "scale_up")[0].count == 1
    refused = [d for d in decisions if d.action == "scale_up" and not d.allowed]
    assert refused and "max_nodes" in refused[0].reasons[0]


def test_transient_shortfall_is_priced_not_scaled_until_it_persists() -> None:
    config = cfg(scale_up_persistence_minutes=10.0, max_transient_price_ratio=1.5)
    memory = ScalerMemory("pool")
    first = plan(33.0, nodes(4, used=8.0), memory, config=config)  # 32 GPUs: a small shortfall
    assert_blocked(first, "scale_up")
    # no node enters service (the warm pool may be stocked for a return to the peak)
    assert not [d for d in allowed(first, "power_on") if d.inputs.to != "standby"]
    assert any("transient" in d.reasons[0] for d in first)
    later = plan(33.0, nodes(4, used=8.0), memory, minute=10, config=config)
    assert allowed(later, "scale_up")
    big = plan(60.0, nodes(4, used=8.0), ScalerMemory("pool"), config=config)
    assert allowed(big, "scale_up")  # pricing cannot absorb it: scale at once


def test_a_dear_shortfall_waits_one_tick_unless_no_price_drains_it() -> None:
    config = cfg(
        scale_up_persistence_minutes=60.0, max_transient_price_ratio=1.5, urgent_persistence_minutes=3.0
    )
    memory = ScalerMemory("pool")
    assert not allowed(plan(50.0, nodes(4, used=8.0), memory, config=config), "scale_up")  # a blip?
    assert allowed(plan(50.0, nodes(4, used=8.0), memory, minute=3, config=config), "scale_up")
    undrainable = plan(200.0, nodes(4, used=8.0), ScalerMemory("pool"), config=config)
    assert allowed(undrainable, "scale_up")  # even price_max cannot certify: no waiting


def test_a_shortfall_of_headroom_or_forecast_alone_waits_one_tick() -> None:
    config = cfg(headroom_fraction=0.05, anticipatory_persistence_minutes=5.0)
    memory = ScalerMemory("pool")
    # 31 GPUs on 4 nodes: one GPU free, but the forecast's 36 asks for a fifth node
    first = plan(31.0, nodes(4, used=7.75), memory, config=config, forecast=36.0)
    assert_blocked(first, "scale_up")
    assert not [d for d in allowed(first, "power_on") if d.inputs.to != "standby"]  # none into service
    assert any("anticipatory" in r for d in first for r in d.reasons)
    later = plan(31.0, nodes(4, used=7.75), memory, minute=5, config=config, forecast=36.0)
    assert allowed(later, "scale_up")  # still asked for a tick later: a trend, not a spike
    gone = ScalerMemory("pool")
    plan(31.0, nodes(4, used=7.75), gone, config=config, forecast=36.0)
    assert not allowed(plan(28.0, nodes(4, used=7.0), gone, minute=5, config=config), "scale_up")


def test_a_full_pool_scales_at_once() -> None:
    config = cfg(headroom_fraction=0.05, anticipatory_persistence_minutes=5.0)
    # 32 GPUs on 4 nodes: none free, so the shortfall is not anticipation but demand waiting
    assert allowed(
        plan(32.0, nodes(4, used=8.0), ScalerMemory("pool"), config=config, forecast=36.0), "scale_up"
    )
    # GPUs free but tasks queued (fragmented: no node has room for them): not anticipation either
    queued = PoolState(
        "pool", node_gpus=8, max_nodes=20, demand_gpus=31.0, backlog_gpus=4.0, gpu_hour_cost=1.2
    )
    decisions = plan_pool(queued, 36.0, 1.0, nodes(4, used=7.0), {}, config, T0, memory=ScalerMemory("pool"))
    assert allowed(decisions, "scale_up")
    off = cfg(headroom_fraction=0.05, anticipatory_persistence_minutes=0.0)
    assert allowed(
        plan(31.0, nodes(4, used=7.75), ScalerMemory("pool"), config=off, forecast=36.0), "scale_up"
    )


def test_scale_down_waits_for_hysteresis_then_cordons_the_least_loaded() -> None:
    memory = ScalerMemory("pool")
    node_list = nodes(5, used=3.0) + [NodeView("light", NodeState.ACTIVE, 8, 1.0)]
    early = plan(12.0, node_list, memory, minute=0)
    assert not allowed(early, "cordon") and any("hysteresis" in r for d in early for r in d.reasons)
    later = plan(12.0, node_list, memory, minute=25)
    cordoned = allowed(later, "cordon")
    assert cordoned and cordoned[0].node_id == "light"
    assert cordoned[0].certificate_margin is not None and cordoned[0].certificate_margin > 0
    assert memory.draining.keys() == {d.node_id for d in cordoned}


def test_a_batch_is_powered_off_together_once_every_drain_is_done() -> None:
    memory = ScalerMemory("pool")
    config = cfg(scale_down_wave_minutes=0.0)  # one wave: the batch goes once it is drained
    plan(12.0, nodes(6, used=3.0), memory, minute=0, config=config)
    picked = [
        d.node_id for d in allowed(plan(12.0, nodes(6, used=3.0), memory, minute=25, config=config), "cordon")
    ]
    assert len(picked) >= 2
    still = nodes(6, used=3.0, cordoned=tuple(picked))
    half = {picked[0]: DrainStatus(picked[0], True)} | {n: DrainStatus(n, False) for n in picked[1:]}
    waiting = plan(12.0, still, memory, minute=26, drains=half, config=config)
    assert not allowed(waiting, "scale_down")
    assert any(d.node_id == picked[0] and "waiting" in d.reasons[0] for d in waiting)
    done = plan(
        12.0, still, memory, minute=30, drains={n: DrainStatus(n, True) for n in picked}, config=config
    )
    assert sorted(d.node_id for d in allowed(done, "scale_down")) == sorted(picked)
    assert not set(picked) & set(memory.draining)


def test_empty_node_needs_no_drain_status_and_refills_the_warm_pool() -> None:
    memory = ScalerMemory("pool")
    config = cfg(warm_pool_nodes=1)
    node_list = nodes(5, used=3.0) + [
        NodeView("e", NodeState.ACTIVE, 8, 0.0),
        NodeView("s0", NodeState.STANDBY, 8),
    ]
    plan(12.0, node_list, memory, config=config)
    cordoned = allowed(plan(12.0, node_list, memory, minute=25, config=config), "cordon")
    assert "e" in {d.node_id for d in cordoned}
    emptied = [
        n if n.node_id not in memory.draining else dataclasses.replace(n, state=NodeState.CORDONED)
        for n in node_list
    ]
    removed = allowed(
        plan(
            12.0,
            emptied,
            memory,
            minute=26,
            config=config,
            drains={n: DrainStatus(n, True) for n in memory.draining if n != "e"},
        ),
        "scale_down",
    )
    targets = {d.node_id: d.inputs.to for d in removed}
    assert "e" in targets and "off" in targets.values()  # the warm pool already has its node


def test_no_scale_down_when_the_certificate_fails_at_the_lower_capacity() -> None:
    memory = ScalerMemory("pool")
    # 36 GPUs forecast: 5 nodes (40) certify 36/0.95=37.9, 4 nodes (32) do not
    plan(30.0, nodes(6, used=5.0), memory, forecast=36.0, minute=0)
    decisions = plan(30.0, nodes(6, used=5.0), memory, forecast=36.0, minute=25)
    assert len(allowed(decisions, "cordon")) == 1  # 6 -> 5 only


def test_no_saving_blocks_a_removal() -> None:
    costly = cfg(replacement_cost_per_node=1000.0)
    memory = ScalerMemory("pool")
    plan(12.0, nodes(6, used=3.0), memory, config=costly)
    decisions = plan(12.0, nodes(6, used=3.0), memory, minute=25, config=costly)
    assert_blocked(decisions, "cordon")
    assert any("no_saving" in d.reasons[0] for d in decisions)


def test_cooldown_after_scale_up_blocks_scale_down() -> None:
    memory = ScalerMemory("pool", last_scale_up_at=T0.timestamp())
    plan(12.0, nodes(6, used=3.0), memory, minute=-30)  # surplus seen long before
    decisions = plan(12.0, nodes(6, used=3.0), memory, minute=5)
    assert_blocked(decisions, "cordon")
    assert any("scale_up_cooldown" in r for d in decisions for r in d.reasons)
    assert allowed(plan(12.0, nodes(6, used=3.0), memory, minute=11), "cordon")


def test_blocked_drain_is_reported_after_max_attempts_and_not_retried() -> None:
    config = cfg(failed_scale_down_cooldown_minutes=0.0, max_drain_attempts=2, disruption_budget_pct=1.0)
    memory = ScalerMemory("pool")
    minute = 0
    plan(12.0, nodes(6, used=3.0), memory, config=config, minute=minute)
    victim = None
    for _ in range(2):
        minute += 25
        cordon = allowed(plan(12.0, nodes(6, used=3.0), memory, config=config, minute=minute), "cordon")
        victim = victim or cordon[0].node_id
        assert [d.node_id for d in cordon] == [victim]
        minute += 1
        blocked = {victim: DrainStatus(victim, False, blocked=True, reason="task refuses eviction")}
        out = plan(
            12.0, nodes(6, used=3.0, cordoned=(victim,)), memory, config=config, minute=minute, drains=blocked
        )
        assert allowed(out, "uncordon")[0].node_id == victim
    assert victim in memory.blocked
    later = plan(12.0, nodes(6, used=3.0), memory, config=config, minute=minute + 60)
    assert victim not in {d.node_id for d in allowed(later, "cordon")}
    report = [d for d in later if d.node_id == victim and not d.allowed]
    assert report and report[0].reasons[0] == "blocked_drain"


def test_failed_drain_starts_a_cooldown() -> None:
    memory = ScalerMemory("pool")
    plan(12.0, nodes(6, used=3.0), memory)
    picked = [d.node_id for d in allowed(plan(12.0, nodes(6, used=3.0), memory, minute=25), "cordon")]
    plan(
        12.0,
        nodes(6, used=3.0, cordoned=tuple(picked)),
        memory,
        minute=26,
        drains={n: DrainStatus(n, False, blocked=True) for n in picked},
    )
    again = plan(12.0, nodes(6, used=3.0), memory, minute=40)
    assert not allowed(again, "cordon")
    assert any("failed_scale_down_cooldown" in r for d in again for r in d.reasons)


def test_disruption_budget_caps_busy_drains_but_not_empty_nodes() -> None:
    config = cfg(disruption_budget_pct=20.0)
    memory = ScalerMemory("pool")
    plan(8.0, nodes(10, used=0.8), memory, config=config)
    decisions = plan(8.0, nodes(10, used=0.8), memory, minute=25, config=config)
    assert len(allowed(decisions, "cordon")) == 2  # 20% of 10 nodes
    empty = ScalerMemory("pool")
    plan(0.0, nodes(10, used=0.0), empty, config=config)
    # all but one: no capacity at all cannot keep the required margin
    assert len(allowed(plan(0.0, nodes(10, used=0.0), empty, minute=25, config=config), "cordon")) == 9


def test_unhealthy_node_is_replaced_before_it_is_removed() -> None:
    node_list = nodes(4, used=6.0) + [NodeView("sick", NodeState.ACTIVE, 8, 6.0, healthy=False)]
    memory = ScalerMemory("pool")
    first = plan(35.0, node_list + [NodeView("s0", NodeState.STANDBY, 8)], memory)  # needs 5 nodes
    assert allowed(first, "power_on")  # the replacement comes up first
    assert not allowed(first, "replace")
    up = node_list + [NodeView("s0", NodeState.ACTIVE, 8, 0.0)]
    second = plan(35.0, up, memory, minute=2)
    assert allowed(second, "replace")[0].node_id == "sick"
    drained = nodes(4, used=6.0) + [
        NodeView("sick", NodeState.CORDONED, 8, 0.0, healthy=False),
        NodeView("s0", NodeState.ACTIVE, 8, 6.0),
    ]
    third = plan(35.0, drained, memory, minute=7, config=cfg(warm_pool_nodes=1))  # the warm pool is empty
    removed = allowed(third, "scale_down")
    assert [d.node_id for d in removed] == ["sick"] and removed[0].inputs.to == "off"  # repair, not standby


def test_recent_peak_holds_capacity_within_the_band() -> None:
    config = cfg(keep_window_hours=2.0, keep_band_fraction=0.25, keep_band_step_changes=0)  # share only
    memory = ScalerMemory("pool")
    plan(70.0, nodes(10, used=7.0), memory, config=config)  # a peak: 74 GPUs -> 10 nodes
    plan(40.0, nodes(10, used=4.0), memory, minute=1, config=config)
    decisions = plan(40.0, nodes(10, used=4.0), memory, minute=30, config=config)
    # need: 40/0.95 -> 6 nodes; the peak would keep 10 but the band allows 6 + 1
    assert decisions[0].inputs.keep_nodes == 7
    assert len(allowed(decisions, "cordon")) == 3


def test_warm_pool_is_stocked_to_keep_a_recent_peak_drainable() -> None:
    config = cfg(drainable_floor_window_hours=24.0, warm_pool_nodes=1)
    memory = ScalerMemory("pool")
    plan(160.0, nodes(20, used=8.0), memory, config=config)  # a peak seen
    decisions = plan(8.0, nodes(2, used=4.0), memory, minute=60, config=config)
    prewarm = [d for d in allowed(decisions, "power_on") if d.inputs.to == "standby"]
    assert prewarm and prewarm[0].count > 1 and "prewarm" in prewarm[0].reasons[0]


def test_decisions_are_json_able_and_ids_stable() -> None:
    one = plan(60.0, nodes(4, used=8.0, standby=1), ScalerMemory("pool"))
    two = plan(60.0, nodes(4, used=8.0, standby=1), ScalerMemory("pool"))
    assert [d.decision_id for d in one] == [d.decision_id for d in two]
    assert len({d.decision_id for d in one}) == len(one)
    json.dumps([d.to_dict() for d in one])


def test_memory_round_trips_through_json() -> None:
    memory = ScalerMemory("pool")
    plan(12.0, nodes(6, used=3.0), memory, config=cfg(keep_window_hours=3.0, keep_band_fraction=0.0))
    plan(
        12.0, nodes(6, used=3.0), memory, minute=25, config=cfg(keep_window_hours=3.0, keep_band_fraction=0.0)
    )
    restored = ScalerMemory.from_dict(json.loads(json.dumps(memory.to_dict())))
    assert restored == memory and memory.draining and memory.demand_peaks
    with pytest.raises(ScalingError, match="missing key"):
        ScalerMemory.from_dict({})


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ScalingError, match="memory.pool"):
        plan(10.0, nodes(2), ScalerMemory("other"))
    with pytest.raises(ScalingError, match="duplicate"):
        plan(10.0, nodes(2) + nodes(1), ScalerMemory("pool"))
    with pytest.raises(ScalingError, match="forecast_q90"):
        plan(10.0, nodes(2), ScalerMemory("pool"), forecast=float("nan"))
    with pytest.raises(ScalingError, match="used_gpus"):
        NodeView("x", NodeState.ACTIVE, 8, 9.0)
    with pytest.raises(ScalingError, match="hysteresis_minutes"):
        cfg(hysteresis_minutes=-1.0)
