"""Build the policy's typed settings from the project configuration (one TOML + env)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from market_pipeline.scaling.types import ScalingConfig, ScalingError
from market_pipeline.tick.certificate import BacklogParams, backlog_params

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig


def scaling_config_from_config(config: MarketPipelineConfig, pool_id: str) -> ScalingConfig:
    """`[scaling]`, `[guardrails.backlog]`, the task-drain disruption budget and the pool."""
    if pool_id not in config.pool_by_id:
        raise ScalingError(f"pool: unknown pool id {pool_id!r} (known: {sorted(config.pool_by_id)})")
    section = config.scaling
    pool = config.pool_by_id[pool_id]
    return ScalingConfig(
        backlog=backlog_params(config.guardrails.backlog, pool),
        headroom_fraction=section.headroom,
        hysteresis_minutes=section.hysteresis_minutes,
        scale_up_cooldown_minutes=section.scale_up_cooldown_minutes,
        failed_scale_down_cooldown_minutes=section.failed_scale_down_cooldown_minutes,
        failed_drains_to_pause_pool=section.failed_drains_to_pause_pool,
        max_drain_attempts=section.max_drain_attempts,
        drain_cost_per_gpu=section.drain_cost_per_gpu,
        replacement_cost_per_node=section.replacement_cost_per_node,
        scale_up_persistence_minutes=section.scale_up_persistence_minutes,
        disruption_budget_pct=config.guardrails.task_drain.pool_disruption_budget_pct,
        warm_pool_nodes=pool.warm_nodes,
        warm_reserve_fleet_fraction=section.warm_reserve_fleet_fraction,
    )


def normalised_prices(params: BacklogParams, reference_price: float) -> BacklogParams:
    """Price bounds relative to a reference price of 1 (replays have no currency)."""
    if reference_price <= 0:
        raise ScalingError(f"reference_price: must be > 0, got {reference_price}")
    return replace(
        params,
        price_min=params.price_min / reference_price,
        price_max=params.price_max / reference_price,
    )
