"""Backlog-drainability certificate and action shield (queue level).

After Yan, Yorulmaz, Zhou, Başar, "A Stackelberg Game Framework with Drainability
Guardrails for Pricing and Scaling in Multi-Tenant GPU Cloud Platforms", arXiv:2604.16802
(2026). Not to be confused with *task* drainability (whether a running task may be evicted),
which lives in `market_pipeline.drain`.

Model, per pool and per control-loop interval (all rates in GPUs, i.e. GPU-minutes of work
per minute):

* ``F`` — the forecast's upper quantile of demand (running + pending GPUs) over the
  interval, made at the reference price ``p_ref`` (the equilibrium price the forecast
  assumed).
* Residual floor ``R = max(residual_floor_gpus, residual_share * F)`` — delay-insensitive
  work (batch training, sweeps) that stays whatever the price: it waits instead of leaving.
* Delay-sensitive part ``E0 = max(0, F - R)``, which answers price with constant elasticity
  ``eps``: ``E(p) = E0 * (p / p_ref) ** -eps``.
* Arrivals at price ``p``: ``A(p) = R + E(p)``. ``A`` is decreasing in ``p`` but never below
  ``R``: under a bounded price ``p <= price_max`` a bounded capacity may be unable to serve
  the floor, and then the backlog grows without bound (undrainable).
* Service at capacity ``c`` (GPUs): ``S(c) = service_efficiency * c`` (the efficiency
  discounts fragmentation: not every free GPU fits a queued job).
* Drift ``d = A(p) - S(c)``: the expected growth of the backlog per minute. The forecast
  demand already counts pending GPUs, so the drift includes the existing backlog.
* Required margin ``m = max(min_margin_gpus, margin_fraction * S(c), B / H)`` with ``B`` the
  current backlog and ``H`` the drain horizon: the backlog must shrink by at least ``m`` per
  minute, which drains ``B`` within ``H`` minutes and absorbs forecast error.
* The action ``(p, c)`` is **admissible** iff ``d <= -m``. Because ``F`` is an upper
  quantile over the whole interval, the drift is negative uniformly over the interval, not
  only at its start. The certificate reports the slack ``margin = -d`` next to ``m``.

The **shield** projects an inadmissible ``(p, c)`` to the nearest admissible action: first
more capacity (the least multiple of the node size that certifies, if within
``max_capacity_gpus``, which the caller sets to what it can bring online in the interval),
else the maximum reachable capacity and the least price in ``[price_min, price_max]`` that
certifies there; if even ``(price_max, max capacity)`` is inadmissible the backlog is
undrainable in this interval: the shield returns that corner, ``feasible=False``, and says
why. Every step taken is recorded in ``why``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from market_pipeline.config import BacklogGuardrailConfig, MarketPipelineConfig, Pool

_EPS = 1e-9


class BacklogGuardrailError(ValueError):
    """An input to the backlog guardrail is invalid; the message names the field."""


def _require(condition: bool, field: str, problem: str) -> None:
    if not condition:
        raise BacklogGuardrailError(f"{field}: {problem}")


def _finite_nonneg(value: float, field: str) -> None:
    _require(math.isfinite(value) and value >= 0, field, f"must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class BacklogParams:
    """Guardrail thresholds (config `[guardrails.backlog]` plus the pool's price bounds)."""

    residual_share: float = 0.15
    residual_floor_gpus: float = 0.0
    elasticity: float = 0.8
    service_efficiency: float = 1.0
    min_margin_gpus: float = 0.5
    margin_fraction: float = 0.05
    drain_horizon_minutes: float = 30.0
    price_min: float = 0.0
    price_max: float = math.inf

    def __post_init__(self) -> None:
        _require(0 <= self.residual_share <= 1, "residual_share", "must be in [0, 1]")
        _finite_nonneg(self.residual_floor_gpus, "residual_floor_gpus")
        _finite_nonneg(self.elasticity, "elasticity")
        _require(0 < self.service_efficiency <= 1, "service_efficiency", "must be in (0, 1]")
        _finite_nonneg(self.min_margin_gpus, "min_margin_gpus")
        _require(0 <= self.margin_fraction < 1, "margin_fraction", "must be in [0, 1)")
        _require(self.drain_horizon_minutes > 0, "drain_horizon_minutes", "must be > 0")
        _require(self.price_min >= 0, "price_min", "must be >= 0")
        _require(self.price_max >= self.price_min, "price_max", "must be >= price_min")


@dataclass(frozen=True)
class BacklogState:
    """What the certificate needs to know about one pool for the coming interval."""

    pool: str
    demand_forecast_gpus: float
    reference_price: float
    backlog_gpus: float = 0.0
    max_capacity_gpus: float = math.inf
    capacity_step_gpus: float = 1.0

    def __post_init__(self) -> None:
        _finite_nonneg(self.demand_forecast_gpus, "demand_forecast_gpus")
        _require(
            math.isfinite(self.reference_price) and self.reference_price > 0,
            "reference_price",
            f"must be finite and > 0, got {self.reference_price!r}",
        )
        _finite_nonneg(self.backlog_gpus, "backlog_gpus")
        _require(self.max_capacity_gpus >= 0, "max_capacity_gpus", "must be >= 0")
        _require(self.capacity_step_gpus > 0, "capacity_step_gpus", "must be > 0")


@dataclass(frozen=True)
class Certificate:
    pool: str
    price: float
    capacity_gpus: float
    admissible: bool
    drift: float
    margin: float
    required_margin: float
    arrivals: float
    residual_floor: float
    service: float
    reason: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PriceCapacityAction:
    price: float
    capacity_gpus: float


@dataclass(frozen=True)
class ShieldedAction:
    requested: PriceCapacityAction
    price: float
    capacity_gpus: float
    certificate: Certificate
    feasible: bool
    changed: bool
    why: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "requested_price": self.requested.price,
            "requested_capacity_gpus": self.requested.capacity_gpus,
            "price": self.price,
            "capacity_gpus": self.capacity_gpus,
            "feasible": self.feasible,
            "changed": self.changed,
            "why": list(self.why),
            "certificate": self.certificate.to_dict(),
        }


def residual_floor(state: BacklogState, params: BacklogParams) -> float:
    return max(params.residual_floor_gpus, params.residual_share * state.demand_forecast_gpus)


def arrivals_at_price(state: BacklogState, price: float, params: BacklogParams) -> float:
    # an unbounded price (price_max = inf) is allowed: it prices out all elastic demand
    _require(price > 0, "price", f"must be > 0, got {price!r}")
    floor = residual_floor(state, params)
    elastic = max(0.0, state.demand_forecast_gpus - floor)
    return floor + elastic * (price / state.reference_price) ** (-params.elasticity)


def service_gpus(capacity_gpus: float, params: BacklogParams) -> float:
    return params.service_efficiency * capacity_gpus


def required_margin(state: BacklogState, service: float, params: BacklogParams) -> float:
    return max(
        params.min_margin_gpus,
        params.margin_fraction * service,
        state.backlog_gpus / params.drain_horizon_minutes,
    )


def certify(pool_state: BacklogState, price: float, capacity: float, params: BacklogParams) -> Certificate:
    """Certify that the backlog drifts down by the required margin under (price, capacity)."""
    _finite_nonneg(capacity, "capacity")
    arrivals = arrivals_at_price(pool_state, price, params)
    service = service_gpus(capacity, params)
    drift = arrivals - service
    needed = required_margin(pool_state, service, params)
    admissible = -drift >= needed - _EPS
    if admissible:
        reason = f"drift {drift:.3f} <= -{needed:.3f}: backlog drains"
    elif drift < 0:
        reason = f"drift {drift:.3f} negative but margin {-drift:.3f} < required {needed:.3f}"
    else:
        reason = f"drift {drift:.3f} >= 0: backlog does not drain"
    return Certificate(
        pool=pool_state.pool,
        price=price,
        capacity_gpus=capacity,
        admissible=admissible,
        drift=drift,
        margin=-drift,
        required_margin=needed,
        arrivals=arrivals,
        residual_floor=residual_floor(pool_state, params),
        service=service,
        reason=reason,
    )


def min_certified_capacity(state: BacklogState, price: float, params: BacklogParams) -> float:
    """Least capacity (a multiple of the step) that certifies at `price`, ignoring the max."""
    arrivals = arrivals_at_price(state, price, params)
    eff = params.service_efficiency
    fixed_margin = max(params.min_margin_gpus, state.backlog_gpus / params.drain_horizon_minutes)
    # service must cover arrivals plus the larger of the fixed and the proportional margin
    needed_service = max(arrivals + fixed_margin, arrivals / (1.0 - params.margin_fraction))
    capacity = needed_service / eff
    step = state.capacity_step_gpus
    return math.ceil(capacity / step - _EPS) * step


def min_certified_price(state: BacklogState, capacity: float, params: BacklogParams) -> float | None:
    """Least price that certifies at `capacity`, or None when no finite price does."""
    service = service_gpus(capacity, params)
    budget = service - required_margin(state, service, params)
    floor = residual_floor(state, params)
    elastic = max(0.0, state.demand_forecast_gpus - floor)
    if elastic <= _EPS:
        return 0.0 if floor <= budget + _EPS else None
    if budget - floor <= _EPS or params.elasticity <= 0:
        return None
    ratio = elastic / (budget - floor)
    if ratio <= 1.0:
        return state.reference_price * ratio ** (1.0 / params.elasticity)
    # in logs: a tiny elasticity would overflow the power; such a price is unbounded anyway
    log_price = math.log(state.reference_price) + math.log(ratio) / params.elasticity
    return math.inf if log_price > 700.0 else math.exp(log_price)


def shield(action: PriceCapacityAction, pool_state: BacklogState, params: BacklogParams) -> ShieldedAction:
    """Project `action` onto the admissible set: more capacity first, then a higher price."""
    why: list[str] = []
    price = action.price
    if price < params.price_min:
        why.append(f"price {price:.4g} below price_min, raised to {params.price_min:.4g}")
        price = params.price_min
    if price > params.price_max:
        why.append(f"price {price:.4g} above price_max, lowered to {params.price_max:.4g}")
        price = params.price_max
    capacity = min(action.capacity_gpus, pool_state.max_capacity_gpus)
    if capacity < action.capacity_gpus:
        why.append(f"capacity {action.capacity_gpus:g} above reachable max, cut to {capacity:g}")

    cert = certify(pool_state, price, capacity, params)
    if cert.admissible:
        return _result(action, price, capacity, cert, True, why or ["admissible as requested"])

    needed_capacity = min_certified_capacity(pool_state, price, params)
    if needed_capacity <= pool_state.max_capacity_gpus:
        why.append(f"capacity raised {capacity:g} -> {needed_capacity:g} GPUs ({cert.reason})")
        capacity = needed_capacity
        return _result(action, price, capacity, certify(pool_state, price, capacity, params), True, why)

    capacity = pool_state.max_capacity_gpus
    needed_price = min_certified_price(pool_state, capacity, params)
    if needed_price is not None and needed_price <= params.price_max:
        # a hair above the root so rounding cannot leave the drift exactly on the boundary
        new_price = min(params.price_max, max(price, needed_price * (1.0 + 1e-9)))
        why.append(f"capacity at reachable max {capacity:g}; price raised {price:.4g} -> {new_price:.4g}")
        return _result(
            action, new_price, capacity, certify(pool_state, new_price, capacity, params), True, why
        )

    price = params.price_max
    final = certify(pool_state, price, capacity, params)
    why.append(
        f"undrainable: residual floor {final.residual_floor:.2f} + elastic arrivals at "
        f"price_max {params.price_max:.4g} need more than max capacity {capacity:g} serves "
        f"({final.reason}); taking (price_max, max capacity)"
    )
    return _result(action, price, capacity, final, False, why)


def _result(
    action: PriceCapacityAction,
    price: float,
    capacity: float,
    cert: Certificate,
    feasible: bool,
    why: list[str],
) -> ShieldedAction:
    changed = not (math.isclose(price, action.price) and math.isclose(capacity, action.capacity_gpus))
    return ShieldedAction(
        requested=action,
        price=price,
        capacity_gpus=capacity,
        certificate=cert,
        feasible=feasible and cert.admissible,
        changed=changed,
        why=tuple(why),
    )


def backlog_params_from_config(config: MarketPipelineConfig, pool_id: str) -> BacklogParams:
    """Build the params from the loaded configuration and one of its pools (by id)."""
    if pool_id not in config.pool_by_id:
        raise BacklogGuardrailError(f"pool: unknown pool id {pool_id!r}")
    return backlog_params(config.guardrails.backlog, config.pool_by_id[pool_id])


def backlog_params(section: BacklogGuardrailConfig, pool: Pool) -> BacklogParams:
    """The one reader of `[guardrails.backlog]`: its params with the pool's price bounds."""
    return BacklogParams(
        residual_share=section.residual_floor_share,
        elasticity=section.price_elasticity,
        margin_fraction=section.drift_margin,
        min_margin_gpus=section.drift_margin_min_gpus,
        price_min=pool.price_min,
        price_max=pool.price_max,
    )
