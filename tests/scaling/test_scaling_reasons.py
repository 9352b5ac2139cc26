"""Typed scaling reasons: each gate's decision carries its code; the stored text is unchanged."""

from __future__ import annotations

from scaling_testkit import T0, policy_config

from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import NodeState, NodeView, PoolState, ScalerMemory, ScalingReason, Why


def test_a_gate_decision_carries_its_code_and_the_text_operators_read() -> None:
    nodes = [NodeView(f"a{i}", NodeState.ACTIVE, 8, 1.0) for i in range(5)]
    state = PoolState("pool", node_gpus=8, max_nodes=10, demand_gpus=4.0)
    decisions = plan_pool(
        state, 4.0, 1.0, nodes, {}, policy_config(hysteresis_minutes=15.0), T0, memory=ScalerMemory("pool")
    )
    held = [d for d in decisions if ScalingReason.HYSTERESIS in d.codes]
    assert len(held) == 1 and held[0].action == "scale_down" and not held[0].allowed
    assert held[0].reasons[0].startswith("hysteresis: 0 of 4 unneeded node(s) unneeded for 15 min")
    assert all(not d.codes for d in decisions if d is not held[0])


def test_why_renders_code_aside_and_detail() -> None:
    assert str(Why(ScalingReason.BLOCKED_DRAIN)) == "blocked_drain"
    assert str(Why(ScalingReason.NO_ROOM, "no fit")) == "no_room: no fit"
    assert (
        str(Why(ScalingReason.ANTICIPATORY, "need 3 > 2", "4 GPUs free"))
        == "anticipatory (4 GPUs free): need 3 > 2"
    )
