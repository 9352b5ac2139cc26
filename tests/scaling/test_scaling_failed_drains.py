"""plan_pool: a failed drain cools its node down, not the pool, unless failures are systemic."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from scaling_testkit import T0, allowed, policy_config

from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import DrainStatus, NodeState, NodeView, PoolState, ScalerMemory

CONFIG = policy_config(
    hysteresis_minutes=10.0,
    scale_up_cooldown_minutes=0.0,
    max_removals_per_hour=20,
    disruption_budget_pct=50.0,
    scale_down_wave_minutes=30.0,
    failed_scale_down_cooldown_minutes=60.0,
    failed_drains_to_pause_pool=3,
    replacement_cost_per_node=0.5,
)


def plan(node_list, memory, minute, drains=None, config=CONFIG, demand=12.0):
    # 12 GPUs of demand on 6 nodes running 2 GPUs each: the need is 2 nodes, 4 are surplus
    state = PoolState("pool", node_gpus=8, max_nodes=20, demand_gpus=demand, gpu_hour_cost=1.2)
    return plan_pool(
        state, demand, 1.0, node_list, drains or {}, config, T0 + dt.timedelta(minutes=minute), memory=memory
    )


def fleet(cordoned: set[str] = frozenset(), off: set[str] = frozenset()) -> list[NodeView]:
    return [
        NodeView(f"a{i}", NodeState.CORDONED if f"a{i}" in cordoned else NodeState.ACTIVE, 8, 2.0)
        for i in range(6)
        if f"a{i}" not in off
    ]


def first_wave(memory: ScalerMemory) -> list[str]:
    plan(fleet(), memory, 0)
    cordoned = [d.node_id for d in allowed(plan(fleet(), memory, 10), "cordon")]
    assert cordoned == ["a0", "a1", "a2"]  # 50% of the pool may drain at once
    return cordoned


def test_one_failed_drain_is_stood_in_for_and_the_batch_still_goes_in_one_action() -> None:
    memory = ScalerMemory("pool")
    wave = first_wave(memory)
    drains = {
        "a0": DrainStatus("a0", False, blocked=True, reason="task refuses eviction"),
        "a1": DrainStatus("a1", True),
        "a2": DrainStatus("a2", True),
    }
    failed = plan(fleet(set(wave)), memory, 15, drains)
    assert [d.node_id for d in allowed(failed, "uncordon")] == ["a0"]
    stand_ins = [d.node_id for d in allowed(failed, "cordon")]
    assert stand_ins and "a0" not in stand_ins  # no pool-wide cool-down; a0 sits its own out
    assert not allowed(failed, "scale_down")  # a1, a2 wait for the stand-ins: one action
    cordoned = {"a1", "a2", *stand_ins}
    done = plan(fleet(cordoned), memory, 20, {n: DrainStatus(n, True) for n in cordoned})
    assert sorted(d.node_id for d in allowed(done, "scale_down")) == sorted(cordoned)
    rest = fleet(off=cordoned)
    assert len(rest) == 2  # a0 and one more, for demand that now needs one node
    plan(rest, memory, 40, demand=4.0)
    later = plan(rest, memory, 50, demand=4.0)  # a0 still inside its 60-min cool-down
    assert [d.node_id for d in allowed(later, "cordon")] == [n.node_id for n in rest if n.node_id != "a0"]
    skipped = [d for d in later if d.node_id == "a0" and not d.allowed]
    assert skipped and skipped[0].reasons[0].startswith(
        "failed_scale_down_cooldown: its drain failed 35 min ago"
    )
    restored = ScalerMemory.from_dict(json.loads(json.dumps(memory.to_dict())))
    assert (
        restored.drain_failed_at
        == memory.drain_failed_at
        == {"a0": (T0 + dt.timedelta(minutes=15)).timestamp()}
    )


def test_failures_on_several_nodes_at_once_pause_the_pools_scale_down() -> None:
    for pause_at, paused in ((3, True), (4, False)):
        memory = ScalerMemory("pool")
        config = dataclasses.replace(CONFIG, failed_drains_to_pause_pool=pause_at)
        wave = first_wave(memory)
        drains = {n: DrainStatus(n, False, blocked=True, reason="drain agent unreachable") for n in wave}
        decisions = plan(fleet(set(wave)), memory, 15, drains, config=config)
        assert len(allowed(decisions, "uncordon")) == 3
        gate = [r for d in decisions for r in d.reasons if r.startswith("failed_scale_down_cooldown")]
        assert bool(gate) is paused and bool(allowed(decisions, "cordon")) is not paused
        if paused:
            assert "3 drains failed in the last 60 min" in gate[0]


def test_memory_persisted_before_per_node_cool_downs_still_loads() -> None:
    old = {"pool": "pool", "last_failed_scale_down_at": T0.timestamp(), "drain_failures": {"a0": 1}}
    memory = ScalerMemory.from_dict(json.loads(json.dumps(old)))
    assert memory.drain_failures == {"a0": 1} and memory.drain_failed_at == {}
    assert first_wave(memory) == ["a0", "a1", "a2"]  # no cool-down left over, pool-wide or on a0
