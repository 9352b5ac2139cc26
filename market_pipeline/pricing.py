"""From the configured market (pools, tenants' claims) and the fleet to a solvable
`MarketProblem`, and from a `SolveReport` back to price-book rows.

Every pool sells two resources, `<pool>/guaranteed` and `<pool>/drainable`. Both are sold
against the pool's powered GPUs for the next hour: drainable capacity is the same physical
capacity, which guaranteed demand may reclaim by draining (the task-drain guardrail), so
its price sits in the configured discount band below the guaranteed price.

Calibration: the configured tenants' claims say how demand is shared and how it responds to
price, not how much load there is. Each tick the population of a pool is scaled so that, at
the pool's reference prices (its configured base price, drainable at the middle of the
band), it would buy the GPUs the forecast expects for the next hour. The reference is fixed:
anchoring at the prices in force instead would read price-insensitive load as ever-rising
appetite and ratchet prices to the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.market import (
    DRAINABLE,
    GUARANTEED,
    MarketProblem,
    ResourceSet,
    SolveReport,
    SolverSettings,
    TenantPopulation,
    demand_at,
)

# The calibration may stretch or shrink a pool's configured appetite by at most this factor:
# beyond it the claims no longer describe the load and need reconfiguring (the per-tick max
# price step bounds how fast prices follow either way).
MAX_DEMAND_SCALE = 20.0


def resource_name(pool_id: str, resource_class: str) -> str:
    return f"{pool_id}/{resource_class}"


@dataclass(frozen=True)
class PricingInputs:
    problem: MarketProblem
    pool_of_resource: dict[str, str]
    class_of_resource: dict[str, str]
    demand_scale_by_pool: dict[str, float]  # the calibration applied (1 = the claims as configured)


def build_market_problem(
    config: MarketPipelineConfig,
    gpus_on_by_pool: Mapping[str, float],
    expected_demand_by_pool: Mapping[str, float] | None = None,
) -> PricingInputs:
    """The market for the next interval: capacity = powered GPUs x 1 h per pool, tenants
    calibrated to ``expected_demand_by_pool`` (GPUs wanted next hour; pools left out keep
    the configured claims)."""
    if not config.tenants:
        raise ValueError("tenants: the configuration registers no tenant claims to price against")
    names: list[str] = []
    pools: list[str] = []
    classes: list[str] = []
    capacity, unit_cost, price_min, price_max, disc_min, disc_max = [], [], [], [], [], []
    for pool in config.pools:
        model = config.gpu_model_by_name[pool.gpu_model]
        for cls in (GUARANTEED, DRAINABLE):
            names.append(resource_name(pool.pool_id, cls))
            pools.append(pool.pool_id)
            classes.append(cls)
            capacity.append(float(gpus_on_by_pool.get(pool.pool_id, 0.0)))
            unit_cost.append(model.cost_per_gpu_hour)
            low = pool.price_min * (1.0 - config.market.drainable_discount_max) if cls == DRAINABLE else pool.price_min
            price_min.append(low)
            price_max.append(pool.price_max)
            disc_min.append(config.market.drainable_discount_min if cls == DRAINABLE else 0.0)
            disc_max.append(config.market.drainable_discount_max if cls == DRAINABLE else 0.0)
    resources = ResourceSet(
        names=tuple(names), capacity=np.array(capacity), unit_cost=np.array(unit_cost),
        price_min=np.array(price_min), price_max=np.array(price_max),
        resource_class=tuple(classes), pool=tuple(pools),
        discount_min=np.array(disc_min), discount_max=np.array(disc_max),
    )
    tenants = _population(config, pools, classes)
    problem = MarketProblem(resources, tenants)
    scale_by_pool = calibration_scale(config, problem, pools, expected_demand_by_pool or {})
    if any(k != 1.0 for k in scale_by_pool.values()):
        problem = problem.with_demand_scale(np.array([scale_by_pool[p] for p in pools]))
    return PricingInputs(problem, dict(zip(names, pools)), dict(zip(names, classes)), scale_by_pool)


def mid_band_discount(config: MarketPipelineConfig) -> float:
    """The drainable class's discount at the middle of the configured band."""
    return (config.market.drainable_discount_min + config.market.drainable_discount_max) / 2


def reference_prices(config: MarketPipelineConfig, pools: list[str], classes: list[str]) -> np.ndarray:
    """Per resource, the configured base price (drainable: at the middle of the band)."""
    discount = mid_band_discount(config)
    return np.array([config.pool_by_id[p].base_price * ((1 - discount) if c == DRAINABLE else 1.0)
                     for p, c in zip(pools, classes)])


def calibration_scale(config: MarketPipelineConfig, problem: MarketProblem, pools: list[str],
                      expected_demand_by_pool: Mapping[str, float]) -> dict[str, float]:
    """Per pool, expected GPUs / what the configured tenants buy there at the reference
    prices, within [1/MAX_DEMAND_SCALE, MAX_DEMAND_SCALE]; 1 where there is no expectation
    or no tenant claims the pool's GPU model."""
    scale = {p: 1.0 for p in pools}
    wanted = {p: float(v) for p, v in expected_demand_by_pool.items() if p in scale and np.isfinite(v)}
    if not wanted:
        return scale
    classes = list(problem.resources.resource_class)
    modelled = demand_at(problem, reference_prices(config, pools, classes))
    for pool_id, expected in wanted.items():
        at_reference = float(sum(d for p, d in zip(pools, modelled) if p == pool_id))
        if at_reference > 0:
            scale[pool_id] = float(np.clip(max(expected, 0.0) / at_reference, 1.0 / MAX_DEMAND_SCALE,
                                           MAX_DEMAND_SCALE))
    return scale


def _population(config: MarketPipelineConfig, pools: list[str], classes: list[str]) -> TenantPopulation:
    n, m = len(config.tenants), len(pools)
    weight = np.zeros((n, m))
    saturation = np.ones((n, m))
    delay_cost = np.zeros((n, m))
    for j, tenant in enumerate(config.tenants):
        for r, (pool_id, cls) in enumerate(zip(pools, classes)):
            claim = tenant.claims.get(config.pool_by_id[pool_id].gpu_model)
            if claim is None:
                continue
            weight[j, r] = claim.weight
            saturation[j, r] = claim.saturation
            if cls == DRAINABLE:
                # Drain risk is worth this much per GPU-hour to the tenant.
                delay_cost[j, r] = tenant.delay_sensitivity
    return TenantPopulation.build(
        ids=[t.id for t in config.tenants],
        families=["log"] * n,
        weight=weight,
        saturation=saturation,
        budget=np.array([t.budget_per_hour for t in config.tenants]),
        drainable_mask=np.array([c == DRAINABLE for c in classes]),
        delay_cost=delay_cost,
        drain_tolerant=np.array([t.drain_tolerant for t in config.tenants]),
    )


def solver_settings(config: MarketPipelineConfig) -> SolverSettings:
    return SolverSettings(
        tolerance=config.market.solver_tolerance,
        max_iterations=config.market.solver_max_iterations,
        response_smoothing=config.market.response_smoothing_beta,
    )


def last_prices_vector(problem: MarketProblem, last: Mapping[str, float]) -> np.ndarray | None:
    """Last certified prices in resource order, or None when any resource has none yet."""
    if not all(name in last for name in problem.resource_names):
        return None
    return np.array([float(last[name]) for name in problem.resource_names])


def price_book_rows(config: MarketPipelineConfig, prices: Mapping[str, float],
                    effective_from: datetime, solve_id: str, source: str) -> pl.DataFrame:
    """Price-book rows from prices keyed by resource name (`<pool_id>/<class>`)."""
    rows = []
    for name, price in prices.items():
        pool_id, resource_class = name.rsplit("/", 1)
        pool = config.pool_by_id[pool_id]
        rows.append(_row(pool, resource_class, float(price), effective_from, solve_id, source))
    return _frame(rows)


def base_price_rows(config: MarketPipelineConfig, effective_from: datetime) -> pl.DataFrame:
    """The configured base prices: the price book before the first solve (drainable at the
    middle of its discount band)."""
    mid_discount = mid_band_discount(config)
    rows = []
    for pool in config.pools:
        rows.append(_row(pool, GUARANTEED, pool.base_price, effective_from, "config-base-price", "config"))
        rows.append(_row(pool, DRAINABLE, pool.base_price * (1 - mid_discount), effective_from,
                         "config-base-price", "config"))
    return _frame(rows)


def _row(pool, resource_class: str, price: float, effective_from: datetime, solve_id: str,
         source: str) -> dict:
    return {"effective_from": effective_from, "pool_id": pool.pool_id, "gpu_model": pool.gpu_model,
            "zone": pool.zone, "resource_class": resource_class,
            "price_per_gpu_hour": round(price, 6), "solve_id": solve_id, "source": source}


def _frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema_overrides={"effective_from": pl.Datetime("us", "UTC"),
                                                "price_per_gpu_hour": pl.Decimal(18, 6)})
