"""Seeded synthetic market instances (for benchmarks and tests): ``random_problem`` (the
bench instance) and ``coupled_problem`` (binding budgets, several local optima).

Resources enumerate pools (GPU model x zone), each with a guaranteed and a drainable class.
Tenants want a few GPU models in one or two zones (substitutes), value the drainable class
less (if drain tolerant at all), mix the three utility families, and about half of them are
budget-bound at the reference prices; capacities are set around the reference demand, so a
share of the resources is capacity-bound at the optimum.
"""

from __future__ import annotations

import numpy as np
import torch

from market_pipeline.market.cold_start import initial_prices
from market_pipeline.market.followers import solve_followers
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.resources import DRAINABLE, GUARANTEED, ResourceSet

# (model, unit cost per GPU-hour)
GPU_MODELS = (
    ("H100", 2.40),
    ("A100", 1.50),
    ("L40S", 0.95),
    ("L4", 0.40),
    ("A10", 0.55),
    ("MI300X", 2.10),
    ("V100", 0.60),
    ("T4", 0.22),
)
ZONES = ("us-east", "us-west", "eu-west", "eu-north", "ap-south", "ap-east", "sa-east", "me-central")
DRAINABLE_COST_SHARE = 0.9
REFERENCE_MARKUP = 2.5


def _resources(count: int, rng: np.random.Generator) -> tuple[ResourceSet, np.ndarray]:
    names, classes, pools, costs, models = [], [], [], [], []
    pool_index = 0
    while len(names) < count:
        zone = ZONES[(pool_index // len(GPU_MODELS)) % len(ZONES)]
        cycle = pool_index // (len(GPU_MODELS) * len(ZONES))
        model, cost = GPU_MODELS[pool_index % len(GPU_MODELS)]
        pool = f"{model}/{zone}" + (f"/{cycle}" if cycle else "")
        zone_factor = rng.uniform(0.9, 1.1)
        for cls in (GUARANTEED, DRAINABLE):
            if len(names) < count:
                names.append(f"{pool}/{cls}")
                classes.append(cls)
                pools.append(pool)
                costs.append(cost * zone_factor * (DRAINABLE_COST_SHARE if cls == DRAINABLE else 1.0))
                models.append(pool_index % len(GPU_MODELS))
        pool_index += 1
    cost = np.array(costs)
    resources = ResourceSet(
        names=tuple(names),
        capacity=np.full(count, np.inf),
        unit_cost=cost,
        price_min=0.5 * cost,
        price_max=6.0 * cost,
        resource_class=tuple(classes),
        pool=tuple(pools),
        discount_min=np.full(count, 0.2),
        discount_max=np.full(count, 0.6),
    )
    return resources, np.array(models)


def _tenant_tables(n: int, resources: ResourceSet, models: np.ndarray, rng: np.random.Generator):
    m = resources.size
    zones = np.array([p.split("/")[1] for p in resources.pool])
    zone_names = np.unique(zones)
    wanted_models = rng.random((n, len(GPU_MODELS))) < rng.uniform(0.15, 0.5, (n, 1))
    wanted_models[np.arange(n), rng.integers(0, len(GPU_MODELS), n)] = True
    wanted_zones = rng.random((n, len(zone_names))) < 0.35
    wanted_zones[np.arange(n), rng.integers(0, len(zone_names), n)] = True
    zone_idx = np.searchsorted(zone_names, zones)
    wants = wanted_models[:, models] & wanted_zones[:, zone_idx]
    drainable = resources.drainable_mask
    value_share = np.where(drainable, rng.uniform(0.5, 0.9, (n, m)), 1.0)
    choke = (
        resources.unit_cost[None, :]
        / np.where(drainable, DRAINABLE_COST_SHARE, 1.0)
        * rng.uniform(1.5, 6.0, (n, m))
        * value_share
    )
    saturation = rng.lognormal(np.log(4.0), 1.0, (n, 1)) * rng.uniform(0.5, 1.5, (n, m))
    families = rng.choice(np.array(["log", "isoelastic", "quadratic"]), n, p=[0.7, 0.15, 0.15])
    weight = np.where(families[:, None] == "quadratic", choke, choke * saturation) * wants
    eta = np.where(families == "isoelastic", rng.uniform(0.4, 2.0, n), 1.0)
    delay = np.where(rng.random(n) < 0.3, rng.uniform(0.0, 0.1, n) * resources.unit_cost.mean(), 0.0)
    tolerant = rng.random(n) < 0.7
    return families, weight, saturation, eta, delay, tolerant


def random_problem(tenants: int, resources: int, seed: int = 0) -> MarketProblem:
    """A reproducible instance with ``tenants`` x ``resources``."""
    if tenants < 1 or resources < 1:
        raise ValueError(f"random_problem: need tenants >= 1 and resources >= 1, got {tenants}, {resources}")
    rng = np.random.default_rng(seed)
    res, models = _resources(resources, rng)
    families, weight, saturation, eta, delay, tolerant = _tenant_tables(tenants, res, models, rng)
    ids = [f"t{j:06d}" for j in range(tenants)]

    def population(budget: np.ndarray) -> TenantPopulation:
        return TenantPopulation.build(
            ids=ids,
            families=list(families),
            weight=weight,
            saturation=saturation,
            budget=budget,
            drainable_mask=res.drainable_mask,
            eta=eta,
            delay_cost=delay[:, None] if np.any(delay) else None,
            drain_tolerant=tolerant,
        )

    reference = torch.as_tensor(REFERENCE_MARKUP * res.unit_cost)
    free = population(np.full(tenants, np.inf))
    spend = solve_followers(free.on("cpu"), reference).spend.numpy()
    order = np.argsort(
        np.array([("log", "isoelastic", "quadratic").index(f) for f in families]), kind="stable"
    )
    budget = np.empty(tenants)
    budget[order] = np.maximum(spend, 1e-3) * rng.uniform(0.3, 1.5, tenants)[order]
    budget[rng.random(tenants) < 0.1] = np.inf
    pop = population(budget)
    demand = pop.on("cpu").aggregate(solve_followers(pop.on("cpu"), reference).demand).numpy()
    capacity = np.maximum(demand * rng.uniform(0.6, 1.4, resources), 1.0)
    res = ResourceSet(
        names=res.names,
        capacity=capacity,
        unit_cost=res.unit_cost,
        price_min=res.price_min,
        price_max=res.price_max,
        resource_class=res.resource_class,
        pool=res.pool,
        discount_min=res.discount_min,
        discount_max=res.discount_max,
    )
    return MarketProblem(res, pop)


def coupled_problem(
    tenants: int,
    resources: int,
    seed: int = 0,
    *,
    tight: bool = False,
    budget_share: float = 0.4,
    drainable: bool = False,
) -> MarketProblem:
    """A market where budgets couple the resources: log tenants wanting random subsets of the
    resources, each with a budget of about ``budget_share`` of what it would spend at the
    uncoupled monopoly prices (so nearly every budget binds). Capacity is generous (three times
    that budgeted demand), or with ``tight`` 50-80% of it. ``drainable``: resources come in
    guaranteed/drainable pairs of one pool (discount band 20-60%). The leader's problem has
    several local optima here (see ``global_phase``)."""
    if tenants < 1 or resources < 1:
        raise ValueError(f"coupled_problem: need tenants >= 1 and resources >= 1, got {tenants}, {resources}")
    rng = np.random.default_rng(seed)
    m, n = resources, tenants
    cost = rng.uniform(0.5, 3.0, m)
    classes = tuple(DRAINABLE if drainable and r % 2 else GUARANTEED for r in range(m))
    pools = tuple(f"pool{r // 2 if drainable else r}" for r in range(m))
    if drainable:
        cost[1::2] = 0.9 * cost[0::2][: m // 2]
    wants = rng.random((n, m)) < rng.uniform(0.3, 0.9, (n, 1))
    wants[np.arange(n), rng.integers(0, m, n)] = True
    saturation = rng.lognormal(np.log(3.0), 0.8, (n, 1)) * rng.uniform(0.5, 1.5, (n, m))
    weight = cost * rng.uniform(1.5, 8.0, (n, m)) * saturation * wants
    names = tuple(f"{pool}/{cls}" for pool, cls in zip(pools, classes))

    def market(capacity: np.ndarray, budget: np.ndarray) -> MarketProblem:
        res = ResourceSet(
            names=names,
            capacity=capacity,
            unit_cost=cost,
            price_min=0.5 * cost,
            price_max=10.0 * cost,
            resource_class=classes,
            pool=pools,
            discount_min=np.full(m, 0.2),
            discount_max=np.full(m, 0.6),
        )
        pop = TenantPopulation.build(
            ids=[f"t{j:05d}" for j in range(n)],
            families=["log"] * n,
            weight=weight,
            saturation=saturation,
            budget=budget,
            drainable_mask=res.drainable_mask,
        )
        return MarketProblem(res, pop)

    free = market(np.full(m, np.inf), np.full(n, np.inf))
    monopoly = torch.as_tensor(initial_prices(free))
    spend = solve_followers(free.tenants.on("cpu"), monopoly).spend.numpy()
    budget = np.maximum(spend, 1e-3) * budget_share * rng.uniform(0.7, 1.3, n)
    budgeted = market(np.full(m, np.inf), budget)
    demand = budgeted.tenants.on("cpu").aggregate(
        solve_followers(budgeted.tenants.on("cpu"), monopoly).demand
    )
    share = rng.uniform(0.5, 0.8, m) if tight else np.full(m, 3.0)
    return market(np.maximum(demand.numpy() * share, 1e-3), budget)
