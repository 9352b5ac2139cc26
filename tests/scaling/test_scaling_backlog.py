"""Backlog-drainability certificate and action shield."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market_pipeline.config import load_config
from market_pipeline.tick.certificate import (
    BacklogGuardrailError,
    BacklogParams,
    BacklogState,
    PriceCapacityAction,
    arrivals_at_price,
    backlog_params_from_config,
    certify,
    min_certified_capacity,
    shield,
)

PARAMS = BacklogParams(
    residual_share=0.2,
    elasticity=1.0,
    min_margin_gpus=1.0,
    margin_fraction=0.05,
    price_min=0.5,
    price_max=3.0,
)


def state(
    forecast: float, backlog: float = 0.0, max_capacity: float = math.inf, step: float = 8.0
) -> BacklogState:
    return BacklogState("p", forecast, 1.0, backlog, max_capacity, step)


def test_arrivals_fall_with_price_but_never_below_the_residual_floor() -> None:
    s = state(100.0)
    assert arrivals_at_price(s, 1.0, PARAMS) == pytest.approx(100.0)
    assert arrivals_at_price(s, 2.0, PARAMS) == pytest.approx(20.0 + 80.0 / 2)
    assert arrivals_at_price(s, 1e9, PARAMS) == pytest.approx(20.0, abs=1e-3)


def test_certificate_needs_negative_drift_by_the_margin() -> None:
    s = state(100.0)
    loose = certify(s, 1.0, 120.0, PARAMS)
    assert loose.admissible and loose.drift == pytest.approx(-20.0) and loose.margin == pytest.approx(20.0)
    tight = certify(s, 1.0, 102.0, PARAMS)  # drains, but by less than 5% of capacity
    assert tight.drift < 0 and not tight.admissible and "required" in tight.reason
    short = certify(s, 1.0, 90.0, PARAMS)
    assert short.drift > 0 and not short.admissible and "does not drain" in short.reason


def test_backlog_must_drain_within_the_horizon() -> None:
    no_backlog = certify(state(100.0), 1.0, 110.0, PARAMS)
    big_backlog = certify(state(100.0, backlog=600.0), 1.0, 110.0, PARAMS)  # 600/30 = 20 GPUs/min
    assert no_backlog.admissible and not big_backlog.admissible
    assert big_backlog.required_margin == pytest.approx(20.0)


def test_shield_raises_capacity_first_to_the_least_node_multiple() -> None:
    out = shield(PriceCapacityAction(1.0, 64.0), state(100.0, max_capacity=200.0), PARAMS)
    assert out.feasible and out.changed and out.price == 1.0
    assert out.capacity_gpus == 112.0  # 100/0.95 = 105.3 -> next multiple of 8
    assert not certify(state(100.0), 1.0, 104.0, PARAMS).admissible
    assert any("capacity raised" in why for why in out.why)


def test_shield_raises_price_when_capacity_is_capped() -> None:
    out = shield(PriceCapacityAction(1.0, 64.0), state(100.0, max_capacity=80.0), PARAMS)
    assert out.feasible and out.capacity_gpus == 80.0 and 1.0 < out.price <= PARAMS.price_max
    assert out.certificate.admissible
    slightly_lower = certify(state(100.0), out.price * 0.99, 80.0, PARAMS)
    assert not slightly_lower.admissible  # the least price that certifies


def test_shield_reports_an_undrainable_residual_floor() -> None:
    params = BacklogParams(residual_share=0.9, elasticity=1.0, price_min=0.5, price_max=3.0)
    out = shield(PriceCapacityAction(1.0, 64.0), state(100.0, max_capacity=80.0), params)
    assert not out.feasible and out.price == 3.0 and out.capacity_gpus == 80.0
    assert "undrainable" in out.why[-1]


def test_shield_clamps_price_into_bounds() -> None:
    out = shield(PriceCapacityAction(0.1, 400.0), state(100.0), PARAMS)
    assert out.price == PARAMS.price_min and out.feasible
    assert "below price_min" in out.why[0]


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(BacklogGuardrailError, match="residual_share"):
        BacklogParams(residual_share=1.5)
    with pytest.raises(BacklogGuardrailError, match="demand_forecast_gpus"):
        BacklogState("p", -1.0, 1.0)
    with pytest.raises(BacklogGuardrailError, match="price"):
        certify(state(10.0), 0.0, 10.0, PARAMS)


def test_params_come_from_the_project_config() -> None:
    config = load_config()
    pool = config.pools[0]
    params = backlog_params_from_config(config, pool.pool_id)
    assert params.residual_share == config.guardrails.backlog.residual_floor_share
    assert (params.price_min, params.price_max) == (pool.price_min, pool.price_max)
    with pytest.raises(BacklogGuardrailError, match="unknown pool"):
        backlog_params_from_config(config, "nope@nowhere")


forecasts = st.floats(0.0, 500.0)
capacities = st.floats(0.0, 600.0)
prices = st.floats(0.05, 10.0)


@settings(max_examples=150, deadline=None)
@given(forecasts, st.floats(0.0, 300.0), capacities, prices, st.floats(0.0, 1.0), st.floats(0.0, 2.0))
def test_shield_output_is_admissible_whenever_feasible(
    forecast: float, backlog: float, capacity: float, price: float, share: float, elasticity: float
) -> None:
    params = BacklogParams(residual_share=share, elasticity=elasticity, price_min=0.2, price_max=4.0)
    s = state(forecast, backlog, max_capacity=400.0)
    out = shield(PriceCapacityAction(price, capacity), s, params)
    assert params.price_min <= out.price <= params.price_max
    assert out.capacity_gpus <= 400.0
    if out.feasible:
        assert certify(s, out.price, out.capacity_gpus, params).admissible
    else:
        assert (out.price, out.capacity_gpus) == (params.price_max, 400.0)
        assert not certify(s, params.price_max, 400.0, params).admissible


@settings(max_examples=150, deadline=None)
@given(forecasts, st.floats(0.0, 300.0), prices)
def test_min_certified_capacity_is_the_least_step_multiple(
    forecast: float, backlog: float, price: float
) -> None:
    s = state(forecast, backlog)
    capacity = min_certified_capacity(s, price, PARAMS)
    assert certify(s, price, capacity, PARAMS).admissible
    if capacity >= 8.0:
        assert not certify(s, price, capacity - 8.0, PARAMS).admissible
