"""The keep band: a share of the need, or one typical demand step, capped by a share of the need."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from scaling_testkit import BACKLOG, T0, policy_config

from market_pipeline.scaling.capacity import DemandEnvelope, keep_band, record_demand, target_capacity
from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.types import NodeState, NodeView, PoolState, ScalerMemory

CONFIG = policy_config(keep_window_hours=12.0, hysteresis_minutes=20.0, keep_band_fraction=0.15)
JOB = 16.0  # this pool's demand moves in whole 16-GPU jobs: two nodes each


def test_band_is_the_larger_of_a_share_of_the_need_and_one_demand_step() -> None:
    assert keep_band(7, 0.0, 8, CONFIG) == 1  # no steps seen yet: 15% of 7 nodes
    assert keep_band(7, 4.0, 8, CONFIG) == 1  # small steps: the share still holds
    assert keep_band(7, JOB, 8, CONFIG) == 2  # one 16-GPU job: two nodes
    assert keep_band(7, 64.0, 8, CONFIG) == 2  # a huge step: capped at 40% of the need
    assert keep_band(20, JOB, 8, CONFIG) == 3  # a big pool: its share is wider than one job


def test_step_is_the_median_of_recent_nonzero_changes_and_memory_stays_bounded() -> None:
    config = policy_config(keep_band_step_changes=3)
    memory = ScalerMemory("pool")
    t = T0.timestamp()
    steps = [
        record_demand(memory, demand, t + 300 * i, config).step_gpus
        for i, demand in enumerate([10.0, 10.0, 26.0, 18.0, 50.0, 48.0])
    ]
    # changes 16, 8, 32, 2 (a repeat is no change); the oldest falls out of the last three
    assert memory.demand_steps == [8.0, 32.0, 2.0]
    assert steps == [0.0, 0.0, 16.0, 12.0, 16.0, 8.0]
    restored = ScalerMemory.from_dict(json.loads(json.dumps(memory.to_dict())))
    assert restored == memory
    off = ScalerMemory("pool")
    assert record_demand(off, 10.0, t, policy_config(keep_band_step_changes=0)).step_gpus == 0.0
    assert record_demand(off, 26.0, t + 300, policy_config(keep_band_step_changes=0)).step_gpus == 0.0
    assert off.demand_steps == []


def test_the_band_and_the_forecast_rise_are_not_stacked() -> None:
    """Both cover demand returning above now: the pool keeps the larger of the two, not their sum."""
    backlog = dataclasses.replace(BACKLOG, margin_fraction=0.0, min_margin_gpus=0.25)
    config = policy_config(backlog=backlog, keep_band_fraction=0.2, keep_band_step_changes=0)
    recent_peak = DemandEnvelope(keep_gpus=80.0, floor_gpus=0.0)  # would keep 11 nodes
    state = PoolState("pool", node_gpus=8, max_nodes=20, demand_gpus=36.0)  # 5 nodes
    calm = target_capacity(state, 36.0, 1.0, config, recent_peak)
    assert (calm.need_nodes, calm.band_nodes, calm.keep_nodes) == (5, 1, 6)  # one node of band above demand
    rising = target_capacity(state, 42.0, 1.0, config, recent_peak)  # the forecast rises 6 GPUs: a node more
    assert (rising.need_nodes, rising.band_nodes, rising.keep_nodes) == (6, 1, 6)  # not 6 + 1
    assert rising.demand_need_nodes == 5
    steep = target_capacity(state, 60.0, 1.0, config, recent_peak)  # a rise past the band: the need holds
    assert (steep.need_nodes, steep.keep_nodes) == (8, 8)


def test_demand_wobbling_on_a_node_boundary_keeps_the_node_above_it() -> None:
    """45 GPUs with 5% headroom fit 6 nodes and 46 need 7: a dead band of one step keeps the 7th."""
    backlog = dataclasses.replace(BACKLOG, margin_fraction=0.0, min_margin_gpus=0.25)
    config = policy_config(
        backlog=backlog, headroom_fraction=0.05, keep_band_fraction=0.0, keep_band_step_changes=8
    )
    one_gpu_steps = DemandEnvelope(keep_gpus=46.0, floor_gpus=0.0, step_gpus=1.0)
    state = PoolState("pool", node_gpus=8, max_nodes=20, demand_gpus=45.0)
    at_45 = target_capacity(state, 45.0, 1.0, config, one_gpu_steps)
    assert (at_45.need_nodes, at_45.keep_nodes) == (6, 7)
    at_44 = target_capacity(dataclasses.replace(state, demand_gpus=44.0), 44.0, 1.0, config, one_gpu_steps)
    assert at_44.keep_nodes == 6  # a whole step below the boundary: the 7th may go
    no_band = target_capacity(
        state, 45.0, 1.0, dataclasses.replace(config, keep_deadband_fraction=0.0), one_gpu_steps
    )
    assert no_band.keep_nodes == 6
    # at most a quarter of a node: 6-GPU steps at 41 GPUs (43.05 with headroom) hold 2 GPUs more, not 6
    six_gpu_steps = DemandEnvelope(keep_gpus=64.0, floor_gpus=0.0, step_gpus=6.0)
    at_41 = dataclasses.replace(state, demand_gpus=41.0)
    assert target_capacity(at_41, 41.0, 1.0, config, six_gpu_steps).keep_nodes == 6
    uncapped = dataclasses.replace(config, keep_deadband_fraction=1.0)
    assert target_capacity(at_41, 41.0, 1.0, uncapped, six_gpu_steps).keep_nodes == 7


def _tick(demand: float, memory: ScalerMemory, minute: int, config=CONFIG):
    state = PoolState("pool", node_gpus=8, max_nodes=20, demand_gpus=demand, gpu_hour_cost=1.2)
    fleet = [NodeView(f"a{i}", NodeState.ACTIVE, 8, demand / 11) for i in range(11)]
    return plan_pool(state, demand, 1.0, fleet, {}, config, T0 + dt.timedelta(minutes=minute), memory=memory)


def _replay_jobs(config) -> tuple[ScalerMemory, list]:
    """A 16-GPU job comes and goes, then is gone for half an hour (80 GPUs need 11 nodes)."""
    memory = ScalerMemory("pool")
    for i, demand in enumerate([64.0, 80.0, 64.0, 80.0]):
        _tick(demand, memory, 5 * i, config)
    return memory, [_tick(64.0, memory, 20 + 5 * i, config) for i in range(7)]


def test_a_pool_moving_in_whole_jobs_keeps_room_for_one_job() -> None:
    memory, ticks = _replay_jobs(CONFIG)
    # need at 64 GPUs: 9 nodes; 15% of 9 is one node, one 16-GPU job is two: keep 11
    assert {t[0].inputs.keep_nodes for t in ticks} == {11}
    assert not any(d.action == "cordon" and d.allowed for t in ticks for d in t)
    back = _tick(80.0, memory, 60)
    # the job returns: no node enters service (the warm reserve may prewarm a standby node:
    # it holds one recent jump above the week's peak, and standby serves nothing)
    assert not any(
        d.action in ("scale_up", "power_on") and d.allowed and d.inputs.to != "standby" for d in back
    )


def test_without_the_step_the_same_pool_removes_the_jobs_room() -> None:
    memory, ticks = _replay_jobs(dataclasses.replace(CONFIG, keep_band_step_changes=0))
    assert {t[0].inputs.keep_nodes for t in ticks} == {10}
    assert any(d.action == "cordon" and d.allowed for t in ticks for d in t)
