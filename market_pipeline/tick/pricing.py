"""From the configured market (pools, tenants' claims) and the fleet to a solvable
`MarketProblem` (the market tick, `tick.market_tick`, solves it and publishes the prices).

Every pool sells two resources, `<pool>/guaranteed` and `<pool>/drainable`. Both are sold
against the pool's powered GPUs for the next hour: drainable capacity is the same physical
capacity, which guaranteed demand may reclaim by draining (the task-drain guardrail), so
its price sits in the configured discount band below the guaranteed price.

Calibration: the configured tenants' claims say how demand is shared and how it responds to
price; the forecast says how much load there is. Each tick every pool's tenants value its GPUs
more or less (their utility's weight, not its saturation, is scaled) so that, at the pool's
reference prices (its list price, drainable at the middle of the band), they would buy the
GPUs the forecast expects for the next hour. A tenant's saturation is its size; the load
is how much its work is worth now. With log utility (demand w/p - s) a busier hour is then a
less elastic one (elasticity 1 + s/d), and the leader's price follows the load: cheaper in
the quiet hours than at the peak, inside the promises (`tick.promises`). The reference is
fixed: anchoring at the prices in force instead would read price-insensitive load as
ever-rising appetite and ratchet prices to the cap.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.market.followers import solve_followers
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import SolverSettings
from market_pipeline.market.resources import DRAINABLE, GUARANTEED, ResourceSet
from market_pipeline.market.solve import demand_at
from market_pipeline.tick.promises import Promises

# Share of a pool the drainable class is always sold against: it is never sold out by rule.
DRAINABLE_CAPACITY_FLOOR = 0.02

# The calibration may raise or lower a pool's configured valuation by at most this factor:
# beyond it the claims no longer describe the load and need reconfiguring (the per-tick max
# price step bounds how fast prices follow either way).
MAX_VALUE_SCALE = 100.0
CALIBRATION_ROUNDS = 40


def resource_name(pool_id: str, resource_class: str) -> str:
    return f"{pool_id}/{resource_class}"


@dataclass(frozen=True)
class PricingInputs:
    problem: MarketProblem
    pool_of_resource: dict[str, str]
    class_of_resource: dict[str, str]
    demand_scale_by_pool: dict[str, float]  # the valuation factor applied (1 = the claims as configured)

    def drainable_capacity_by_pool(self) -> dict[str, float]:
        """Per pool, the GPUs its drainable class is sold against (`drainable_capacity`)."""
        return {
            self.pool_of_resource[name]: float(capacity)
            for name, capacity in zip(self.problem.resource_names, self.problem.resources.capacity)
            if self.class_of_resource[name] == DRAINABLE
        }


def build_market_problem(
    config: MarketPipelineConfig,
    gpus_on_by_pool: Mapping[str, float],
    expected_demand_by_pool: Mapping[str, float] | None = None,
    typical_demand_by_pool: Mapping[str, float] | None = None,
    guaranteed_now_by_pool: Mapping[str, float] | None = None,
    in_force: Mapping[str, float] | None = None,
) -> PricingInputs:
    """The market for the next interval: capacity = powered GPUs x 1 h per pool, tenants
    sized to ``typical_demand_by_pool`` (the pool's usual load: at the list prices they buy it
    with `market.reference_elasticity`, so the list price is the equilibrium of a typical
    hour) and their valuation calibrated to ``expected_demand_by_pool`` (GPUs wanted next
    hour). Pools left out of either keep the configured claims for that step.

    With ``guaranteed_now_by_pool`` (the GPUs guaranteed work holds and waits for now), a
    pool's drainable class is sold against what the guaranteed class's claim leaves
    (`drainable_capacity`, the simulator's rule too), the expected claim read at the prices
    ``in_force`` (by resource name; the reference prices where absent) where
    `guardrails.rigid_guarantee.drainable_leaves_expected_claim` is on. Pools left out keep
    the whole pool for both classes."""
    if not config.tenants:
        raise ValueError("tenants: the configuration registers no tenant claims to price against")
    names: list[str] = []
    pools: list[str] = []
    classes: list[str] = []
    capacity, unit_cost, price_min, price_max, disc_min, disc_max = [], [], [], [], [], []
    promises = Promises.from_config(config)
    for pool in config.pools:
        model = config.gpu_model_by_name[pool.gpu_model]
        for cls in (GUARANTEED, DRAINABLE):
            names.append(resource_name(pool.pool_id, cls))
            pools.append(pool.pool_id)
            classes.append(cls)
            capacity.append(float(gpus_on_by_pool.get(pool.pool_id, 0.0)))
            unit_cost.append(model.cost_per_gpu_hour)
            price_min.append(promises.drainable_floor(pool.price_min) if cls == DRAINABLE else pool.price_min)
            price_max.append(pool.price_max)
            disc_min.append(promises.discount_min if cls == DRAINABLE else 0.0)
            disc_max.append(promises.discount_max if cls == DRAINABLE else 0.0)
    resources = ResourceSet(
        names=tuple(names),
        capacity=np.array(capacity),
        unit_cost=np.array(unit_cost),
        price_min=np.array(price_min),
        price_max=np.array(price_max),
        resource_class=tuple(classes),
        pool=tuple(pools),
        discount_min=np.array(disc_min),
        discount_max=np.array(disc_max),
    )
    tenants = _population(config, pools, classes)
    problem = MarketProblem(resources, tenants)
    if typical_demand_by_pool:
        problem = MarketProblem(
            resources,
            sized_to_typical(
                tenants,
                reference_prices(config, pools, classes),
                pools,
                typical_demand_by_pool,
                config.market.reference_elasticity,
            ),
        )
    scale_by_pool = calibration_scale(config, problem, pools, expected_demand_by_pool or {})
    if any(k != 1.0 for k in scale_by_pool.values()):
        problem = MarketProblem(
            problem.resources, value_scaled(problem.tenants, np.array([scale_by_pool[p] for p in pools]))
        )
    if guaranteed_now_by_pool:
        reference = reference_prices(config, pools, classes)
        prices = np.array(
            [float((in_force or {}).get(name, ref)) for name, ref in zip(names, reference)], dtype=np.float64
        )
        expect = config.guardrails.rigid_guarantee.drainable_leaves_expected_claim
        problem = with_guaranteed_claim(problem, guaranteed_now_by_pool, prices if expect else None)
    return PricingInputs(problem, dict(zip(names, pools)), dict(zip(names, classes)), scale_by_pool)


def with_guaranteed_claim(
    problem: MarketProblem, guaranteed_now_by_pool: Mapping[str, float], prices: np.ndarray | None
) -> MarketProblem:
    """The problem with each listed pool's drainable capacity after the guaranteed class's
    claim (`drainable_capacity`): what guaranteed work holds and waits for now, or what the
    tenants buy of the guaranteed class at `prices` (resource order), whichever is more
    (`prices` None: the claim now alone)."""
    res = problem.resources
    expected = np.zeros(res.size) if prices is None else np.nan_to_num(demand_at(problem, prices))
    capacity = res.capacity.astype(np.float64).copy()
    guaranteed = {p: r for r, (p, c) in enumerate(zip(res.pool, res.resource_class)) if c == GUARANTEED}
    for d, (pool_id, cls) in enumerate(zip(res.pool, res.resource_class)):
        g = guaranteed.get(pool_id)
        if cls != DRAINABLE or g is None or pool_id not in guaranteed_now_by_pool:
            continue
        now = max(float(guaranteed_now_by_pool[pool_id]), 0.0)
        capacity[d] = float(drainable_capacity(capacity[g : g + 1], np.array([now]), expected[g : g + 1])[0])
    return MarketProblem(dataclasses.replace(res, capacity=capacity), problem.tenants)


def drainable_capacity(
    usable: np.ndarray, guaranteed_now: np.ndarray, guaranteed_expected: np.ndarray
) -> np.ndarray:
    """Per pool, the GPUs the drainable class is sold against: the pool's usable GPUs less the
    guaranteed class's claim on them, and never under `DRAINABLE_CAPACITY_FLOOR` of the pool.
    The claim is the more of what guaranteed work holds and waits for now and what the
    tenants are expected to hold at the prices in force (the forecast's median, at most the
    pool).

    Guaranteed work may drain drainable work to make room, but only as far as the drain
    guardrail lets it (the landing cool-down, each tenant's daily cap): drainable work sold
    into the room the guaranteed class is about to take back is room its arrivals wait for.
    Counting only what guaranteed work holds now sold that room after every lull (#46, round
    fourteen: on `gpuspec20/vcTJs/s11` a `T4` burst of 1-GPU guaranteed jobs met 40-60
    drainable jobs, 2-12 of them drainable under the guardrail)."""
    usable = np.asarray(usable, dtype=np.float64)
    expected = np.minimum(np.maximum(np.asarray(guaranteed_expected, dtype=np.float64), 0.0), usable)
    claim = np.maximum(np.asarray(guaranteed_now, dtype=np.float64), expected)
    return np.maximum(usable - claim, DRAINABLE_CAPACITY_FLOOR * usable)


def mid_band_discount(config: MarketPipelineConfig) -> float:
    """The drainable class's discount at the middle of the configured band."""
    return Promises.from_config(config).band_mid()


def reference_prices(config: MarketPipelineConfig, pools: list[str], classes: list[str]) -> np.ndarray:
    """Per resource, the configured base price (drainable: at the middle of the band)."""
    discount = mid_band_discount(config)
    return np.array(
        [
            config.pool_by_id[p].base_price * ((1 - discount) if c == DRAINABLE else 1.0)
            for p, c in zip(pools, classes)
        ]
    )


def calibration_scale(
    config: MarketPipelineConfig,
    problem: MarketProblem,
    pools: list[str],
    expected_demand_by_pool: Mapping[str, float],
) -> dict[str, float]:
    """Per pool, the factor on the tenants' valuation that makes them buy the expected GPUs at
    the reference prices, within [1/MAX_VALUE_SCALE, MAX_VALUE_SCALE] (bisection in logs, all
    pools at once: a pool's factor moves its own demand, budgets couple them only weakly); 1
    where there is no expectation or no tenant claims the pool's GPU model."""
    scale = {p: 1.0 for p in pools}
    wanted = {
        p: max(float(v), 0.0) for p, v in expected_demand_by_pool.items() if p in scale and np.isfinite(v)
    }
    if not wanted:
        return scale
    pool_ids = sorted(set(pools))
    column = np.array([pool_ids.index(p) for p in pools])
    target = np.array([wanted.get(p, np.nan) for p in pool_ids])
    reference = reference_prices(config, pools, list(problem.resources.resource_class))
    claimed = demand_at(problem, reference) > 0
    bound = math.log(MAX_VALUE_SCALE)
    free = np.isfinite(target)  # pools without an expectation keep their claims (factor 1)
    lo, hi = np.where(free, -bound, 0.0), np.where(free, bound, 0.0)
    for _ in range(CALIBRATION_ROUNDS):
        mid = 0.5 * (lo + hi)
        demand = demand_at(
            MarketProblem(problem.resources, value_scaled(problem.tenants, np.exp(mid[column]))), reference
        )
        by_pool = np.bincount(column, weights=demand, minlength=len(pool_ids))
        low = free & (by_pool < target)
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    has_claims = np.bincount(column, weights=claimed.astype(float), minlength=len(pool_ids)) > 0
    for i, pool_id in enumerate(pool_ids):
        if pool_id in wanted and has_claims[i]:
            scale[pool_id] = float(np.exp(0.5 * (lo[i] + hi[i])))
    return scale


def sized_to_typical(
    tenants: TenantPopulation,
    reference: np.ndarray,
    pools: list[str],
    typical_by_pool: Mapping[str, float],
    elasticity: float,
) -> TenantPopulation:
    """Log tenants reshaped so that at the reference prices they buy the pool's typical demand,
    shared as their claims share it, each with price elasticity `elasticity` there: demand
    w/p - s = d with (w/p)/d = e gives s = (e - 1) d and w = e p d. Budgets keep their ratio
    to the spend at the reference prices. Pools without a typical demand keep their claims."""
    demand = solve_followers(tenants.on("cpu"), torch.as_tensor(reference, dtype=torch.float64)).demand
    demand = demand.clamp_min(0.0).numpy().astype(np.float64)
    factor = np.ones(len(pools))
    for pool_id, typical in typical_by_pool.items():
        cols = [r for r, p in enumerate(pools) if p == pool_id]
        bought = float(demand[:, cols].sum()) if cols else 0.0
        if cols and bought > 0 and np.isfinite(typical) and typical > 0:
            factor[cols] = typical / bought
    sized = demand * factor
    keep = factor == 1.0  # resources left as configured
    weight = np.where(keep, tenants.weight.numpy(), elasticity * reference * sized)
    saturation = np.where(
        keep, tenants.saturation.numpy(), np.where(sized > 0, (elasticity - 1) * sized, 1.0)
    )
    spend, resized = demand @ reference, sized @ reference
    budget = tenants.budget.numpy() * np.where(spend > 0, resized / np.where(spend > 0, spend, 1.0), 1.0)
    return dataclasses.replace(
        tenants,
        weight=torch.as_tensor(weight),
        saturation=torch.as_tensor(saturation),
        budget=torch.as_tensor(budget),
        _device_cache={},
    )


def value_scaled(tenants: TenantPopulation, factor: np.ndarray) -> TenantPopulation:
    """Every tenant values resource r `factor[r]` times as much (weight x factor; saturation,
    the tenant's size, unchanged); budgets follow the tenant's weight-share of the factor."""
    k = torch.as_tensor(np.asarray(factor, dtype=np.float64))
    total = tenants.weight.sum(dim=1)
    share = torch.where(total > 0, (tenants.weight @ k) / total.clamp_min(1e-300), torch.ones_like(total))
    return dataclasses.replace(
        tenants, weight=tenants.weight * k, budget=tenants.budget * share, _device_cache={}
    )


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
