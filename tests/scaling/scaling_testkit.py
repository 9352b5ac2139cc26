"""Shared setup of the plan_pool tests: a small pool's policy settings."""

from __future__ import annotations

import datetime as dt

from market_pipeline.scaling.types import ScalingConfig
from market_pipeline.tick.certificate import BacklogParams

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
BACKLOG = BacklogParams(residual_share=0.2, elasticity=1.0, price_min=0.5, price_max=3.0)


def policy_config(**changes) -> ScalingConfig:
    """No keep window, drainable floor, persistence or warm pool: a test turns on what it checks."""
    base = dict(
        backlog=BACKLOG,
        keep_window_hours=0.0,
        drainable_floor_window_hours=0.0,
        scale_up_persistence_minutes=0.0,
        urgent_persistence_minutes=0.0,
        min_scale_down_fraction=0.0,
        warm_pool_nodes=0,
        max_removals_per_hour=10,
        interval_minutes=5.0,
    )
    return ScalingConfig(**{**base, **changes})


def allowed(decisions, action):
    """The decisions of `action` the policy allowed."""
    return [d for d in decisions if d.action == action and d.allowed]


def assert_blocked(decisions, action) -> None:
    """No decision of `action` is allowed (the reasons of those that were, if any)."""
    let_through = allowed(decisions, action)
    assert not let_through, [(d.node_id, d.reasons) for d in let_through]
