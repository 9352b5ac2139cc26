"""The shipped split: forecast-error headroom in the capacity target, a small drift floor in the certificate."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math

import pytest

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config
from market_pipeline.scaling.capacity import DemandEnvelope, serving_capacity_gpus, target_capacity
from market_pipeline.scaling.settings import normalised_prices, scaling_config_from_config
from market_pipeline.scaling.types import NodeState, NodeView, PoolState, ScalingConfig
from market_pipeline.tick import PoolTickInput, Promises, run_market_tick

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def shipped() -> ScalingConfig:
    config = load_config(DEFAULT_CONFIG_PATH, environ={})
    pool = config.pools[0]
    scaling = scaling_config_from_config(config, pool.pool_id)
    return dataclasses.replace(
        scaling,
        backlog=normalised_prices(scaling.backlog, pool.base_price),
        interval_minutes=float(config.loop.tick_minutes),
    )


def full_pool(nodes: int = 16) -> list[NodeView]:
    return [NodeView(f"n{i}", NodeState.ACTIVE, 8, 8.0) for i in range(nodes)]


def state(demand: float, backlog: float = 0.0, max_nodes: int = 16) -> PoolState:
    return PoolState(pool="p", node_gpus=8, max_nodes=max_nodes, demand_gpus=demand, backlog_gpus=backlog)


def shield_at(pool: PoolState, forecast: float, nodes: list[NodeView], config: ScalingConfig):
    """The market tick's record for the replay's pool (list price 1, no tenants modelled),
    without the guaranteed cap, so the shield may raise the price as far as the bounds."""
    serving = serving_capacity_gpus(nodes, T0, config)
    tick_input = PoolTickInput(
        pool_id=pool.pool,
        list_price=1.0,
        price_min=config.backlog.price_min,
        price_max=config.backlog.price_max,
        node_gpus=float(pool.node_gpus),
        serving_gpus=serving,
        reachable_gpus=float(pool.max_nodes * pool.node_gpus),
        demand_gpus=pool.demand_gpus,
        backlog_gpus=pool.backlog_gpus,
        forecast_upper_gpus=forecast,
        in_force_guaranteed=1.0,
        in_force_drainable=0.6,
        forecast_price=1.0,
        backlog=config.backlog,
    )
    return run_market_tick([tick_input], None, Promises(guaranteed_cap=config.backlog.price_max)).pools[0]


def test_shipped_certificate_asks_a_small_floor_not_a_share_of_capacity() -> None:
    backlog = shipped().backlog
    assert backlog.margin_fraction == 0.0
    assert 0 < backlog.min_margin_gpus <= 0.5
    assert shipped().headroom_fraction == pytest.approx(0.05)


def test_a_full_pool_with_no_backlog_sheds_only_the_drift_floor() -> None:
    """128 GPUs wanted on 128 GPUs: the price turns away about the floor, not 5% of the pool."""
    config = shipped()
    record = shield_at(state(128.0), 128.0, full_pool(), config)
    assert record.guaranteed > 1.0 and record.certified
    assert record.margin == pytest.approx(config.backlog.min_margin_gpus, abs=1e-6)  # what the price sheds
    assert record.margin < 0.05 * 128


def test_a_full_pool_still_drains_a_backlog_within_the_horizon() -> None:
    config = shipped()
    record = shield_at(state(128.0, backlog=60.0), 128.0, full_pool(), config)
    assert record.required_margin == pytest.approx(60.0 / config.backlog.drain_horizon_minutes)
    assert record.certified and record.margin >= record.required_margin - 1e-9


def test_need_keep_and_warm_reserve_carry_the_same_headroom() -> None:
    """A pool that sits at its recent peak keeps what it needs: no scale-down below the need."""
    config = shipped()
    demand = 76.0  # 76 x 1.05 = 79.8 GPUs: ten 8-GPU nodes, where 76 alone fits in ten too
    level = 78.0  # 78 x 1.05 = 81.9: eleven nodes with headroom, ten without
    target = target_capacity(state(level), level, 1.0, config, DemandEnvelope(level, 0.0, level))
    assert target.need_nodes == math.ceil(level * 1.05 / 8) == 11
    assert target.keep_nodes >= target.need_nodes
    assert target.peak_nodes >= target.need_nodes
    calm = target_capacity(state(demand), demand, 1.0, config, DemandEnvelope(level, 0.0, level))
    assert calm.need_nodes == 10 and calm.keep_nodes == 11  # the recent peak's need, headroom included


def test_an_idle_pool_keeps_its_fixed_headroom_but_no_peak() -> None:
    config = dataclasses.replace(shipped(), headroom_min_gpus=4.0)
    target = target_capacity(state(0.0, max_nodes=4), 0.0, 1.0, config, DemandEnvelope(0.0, 0.0, 0.0))
    assert target.need_nodes == 1 and target.wanted_gpus == pytest.approx(4.0)
    assert target.keep_nodes == 0 and target.peak_nodes == 0


def test_headroom_and_the_forecast_quantile_are_not_stacked() -> None:
    """Both cover forecast error: a wide quantile needs no headroom on top, a calm pool gets it."""
    config = shipped()
    volatile = target_capacity(state(40.0), 60.0, 1.0, config)  # q90 far above demand x 1.05
    assert volatile.wanted_gpus == pytest.approx(60.0) and volatile.need_nodes == 8
    calm = target_capacity(state(60.0), 60.2, 1.0, config)  # q90 within the headroom
    assert calm.wanted_gpus == pytest.approx(63.0) and calm.need_nodes == 8
    above = target_capacity(state(62.0), 62.0, 1.0, config)
    assert above.wanted_gpus == pytest.approx(65.1) and above.need_nodes == 9
