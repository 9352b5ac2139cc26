"""Pools and tenants of a simulation, and the one calibration procedure for all strategies.

Pools are GPU models (the node lists name no zones). Tenants partition the pod list: a pod
belongs to the elastic class if its QoS is drain tolerant (BE, Burstable) and to the rigid
class otherwise (LS, Guaranteed); within a class a stable hash of the pod name picks the
tenant. A tenant's share of the load is its pods' share of the trace's GPU-hours.

Calibration (`calibrate`), applied identically for every strategy:
1. the load level L (GPUs) is the mean of the trace's demand over the simulated window;
2. every pod of the list arrives at the same rate L / sum(g * L_pod) (Little's law: the pod
   list's jobs then hold L GPUs on average) and runs in one of the pools it fits, chosen in
   proportion to the pools' GPUs (the trace names no GPU model: jobs spread over the fleet
   as their shape allows); tenant j's demand for pool r at the list price, d0[j, r], is the
   GPUs its pods hold there;
3. every tenant has an isoelastic utility (`market.utility`) on its class's resource
   (rigid: guaranteed, elastic: drainable) with saturation s = d0, curvature eta = 2 / e_j
   (local price elasticity e_j at d0) and weight w = p0 * s * 2**eta, so that its best
   response at the list price p0 is exactly d0; budget B_j = (1 + headroom) * p0 . d0;
4. time variation scales the whole population by the trace's load index k(t)
   (`TenantPopulation.with_demand_scale`, exact for a uniform k), so at the list price the
   simulated demand is the trace's load, hour by hour;
5. latent elastic demand (`EconomicAssumptions.latent_elastic_ratio`; `_latent_twins`): each
   elastic tenant j gets a latent twin with j's pods, cell chances and curvature eta_j, whose
   choke price is the list price (U'(0) = w / s = p0: it buys nothing at p0, so step 4 still
   holds for every strategy) and whose demand at p0 / 2 is ratio * d0[j]:
   s = ratio * d0 / (2**(1/eta) - 1), w = p0 * s; budget (1 + headroom) times its spend at
   p0 / 2, the same rule as step 3 at its own reference price.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.inputs import FleetNodes, PodTable
from market_pipeline.lab.simulate.settings import EconomicAssumptions, PoolPrices
from market_pipeline.market.followers import solve_followers
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.resources import DRAINABLE, GUARANTEED, ResourceSet

ZONE = "trace"


@dataclass(frozen=True)
class Pool:
    index: int
    model: str
    pool_id: str
    node_rows: np.ndarray  # rows of FleetNodes
    gpus: int
    max_node_gpus: int
    prices: PoolPrices

    def resource_names(self) -> tuple[str, str]:
        base = f"{self.model}/{ZONE}"
        return f"{base}/{GUARANTEED}", f"{base}/{DRAINABLE}"


@dataclass(frozen=True)
class TenantModel:
    """The calibrated tenants; resources are ordered (pool 0 guaranteed, pool 0 drainable, ...)."""

    ids: tuple[str, ...]
    elastic: np.ndarray  # (T,) bool
    elasticity: np.ndarray  # (T,) local price elasticity at the list price
    pods_by_cell: tuple[tuple[np.ndarray, ...], ...]  # [tenant][pool] -> pod rows that may run there
    cell_weights: tuple[tuple[np.ndarray, ...], ...]  # ... and their chance to be the pod, summing to 1
    mean_gpu_hours: np.ndarray  # (T, R) E[g * L] of a job of the cell (0 where none)
    base_demand: np.ndarray  # (T, R) GPUs at the list price and load index 1
    population: TenantPopulation  # at load index 1
    level_gpus: float  # L
    latent: np.ndarray | None = None  # (T,) bool: a latent elastic twin (no demand at list price)
    # The population hour by hour (24, UTC hour of day) where the elasticity swings over the day
    # (`EconomicAssumptions.elasticity_tod_swing`); empty: `population` at every hour.
    hourly: tuple[TenantPopulation, ...] = ()

    def population_at(self, hour: int | None) -> TenantPopulation:
        return self.hourly[int(hour) % 24] if self.hourly and hour is not None else self.population

    @property
    def latent_mask(self) -> np.ndarray:
        return np.zeros(self.size, dtype=bool) if self.latent is None else self.latent

    @property
    def size(self) -> int:
        return len(self.ids)

    def class_column(self) -> np.ndarray:
        """(T,) the resource column (0 guaranteed, 1 drainable) each tenant buys."""
        return self.elastic.astype(np.int64)


def build_pools(nodes: FleetNodes, prices: tuple[PoolPrices, ...]) -> tuple[Pool, ...]:
    models = np.asarray(nodes.models)
    pools = []
    for index, price in enumerate(prices):
        rows = np.flatnonzero(models == price.model)
        pools.append(
            Pool(
                index,
                price.model,
                f"{price.model}@{ZONE}",
                rows,
                int(nodes.gpus[rows].sum()),
                int(nodes.gpus[rows].max()),
                price,
            )
        )
    return tuple(pools)


def pod_fits_pool(pods: PodTable, nodes: FleetNodes, pool: Pool) -> np.ndarray:
    """(P,) bool: some node of the pool has the GPUs, CPU and memory of the pod, and the
    pod's gpu_spec (if any) allows the pool's model."""
    gpus, cpu, mem = (
        nodes.gpus[pool.node_rows],
        nodes.cpu_milli[pool.node_rows],
        nodes.mem_mib[pool.node_rows],
    )
    fits = np.zeros(pods.size, dtype=bool)
    # distinct node shapes are few: test each shape against every pod
    for g, c, m in set(zip(gpus.tolist(), cpu.tolist(), mem.tolist())):
        fits |= (pods.num_gpu <= g) & (pods.cpu_milli <= c) & (pods.mem_mib <= m)
    allowed = np.array([not spec or pool.model in spec for spec in pods.gpu_spec], dtype=bool)
    return fits & allowed


def _tenant_of(names: tuple[str, ...], count: int) -> np.ndarray:
    return np.array([zlib.crc32(n.encode()) % count for n in names], dtype=np.int64)


def resource_set(pools: tuple[Pool, ...], capacity: np.ndarray | None = None) -> ResourceSet:
    names, classes, pool_ids, cost, low, high, dmin, dmax = [], [], [], [], [], [], [], []
    for pool in pools:
        pp = pool.prices
        for cls, name in zip((GUARANTEED, DRAINABLE), pool.resource_names()):
            names.append(name)
            classes.append(cls)
            pool_ids.append(pool.pool_id)
            cost.append(pp.serve_cost)
            drain_floor = (1.0 - pp.discount_max) * pp.price_min
            low.append(pp.price_min if cls == GUARANTEED else drain_floor)
            high.append(
                pp.guaranteed_max if cls == GUARANTEED else (1.0 - pp.discount_min) * pp.guaranteed_max
            )
            dmin.append(pp.discount_min)
            dmax.append(pp.discount_max)
    cap = np.full(len(names), np.inf) if capacity is None else np.asarray(capacity, dtype=np.float64)
    return ResourceSet(
        tuple(names),
        cap,
        np.array(cost),
        np.array(low),
        np.array(high),
        tuple(classes),
        tuple(pool_ids),
        np.array(dmin),
        np.array(dmax),
    )


ELASTICITY_FLOOR = 0.02  # the isoelastic family needs e > 0: a class stated at 0 is nearly inelastic


def tod_factor(hour: float, swing: float) -> float:
    """The elasticity's time-of-day factor: 1 + swing at 03:00 (night work is the most
    price-sensitive), 1 - swing at 15:00; the same shape as the aggregate truth grid's."""
    return 1.0 + swing * float(np.cos(2 * np.pi * (hour % 24 - 3) / 24))


def _elasticities(elastic: np.ndarray, economics: EconomicAssumptions) -> np.ndarray:
    """Class elasticity, spread evenly over the class's tenants by +-spread (deterministic)."""
    out = np.empty(elastic.size)
    for flag, centre in ((True, economics.elastic_elasticity), (False, economics.rigid_elasticity)):
        rows = np.flatnonzero(elastic == flag)
        spread = np.linspace(-1.0, 1.0, rows.size) if rows.size > 1 else np.zeros(rows.size)
        out[rows] = np.maximum(centre * (1.0 + economics.elasticity_spread * spread), ELASTICITY_FLOOR)
    return out


def calibrate(
    pods: PodTable,
    nodes: FleetNodes,
    pools: tuple[Pool, ...],
    level_gpus: float,
    economics: EconomicAssumptions,
) -> TenantModel:
    """The tenant population whose best response at the list prices is the trace's load."""
    if level_gpus <= 0:
        raise SimulationInputError(f"load level {level_gpus:.3g} GPUs: the trace's demand must be positive")
    fits = np.stack([pod_fits_pool(pods, nodes, pool) for pool in pools], axis=1)  # (P, R)
    is_elastic = np.isin(pods.qos, economics.elastic_qos)
    is_rigid = np.isin(pods.qos, economics.rigid_qos)
    unclassed = ~(is_elastic | is_rigid) & fits.any(axis=1)
    if unclassed.any():
        raise SimulationInputError(
            f"economic assumptions: QoS {sorted(set(pods.qos[unclassed]))} is neither elastic nor rigid"
        )
    k = economics.tenants_per_class
    tenant_code = np.where(is_elastic, k, 0) + _tenant_of(pods.names, k)
    capacity = np.array([p.gpus for p in pools], dtype=np.float64)
    spread = fits * capacity[None, :]
    usable = spread.sum(axis=1) > 0
    spread[usable] /= spread[usable].sum(axis=1, keepdims=True)  # pool choice of each pod
    weight = pods.gpu_hours
    total = weight[usable].sum()
    if total <= 0:
        raise SimulationInputError(
            f"pod list {pods.source}: no pod with a runtime fits any pool of the fleet"
        )
    ids, elastic, cells, chances, mean_gh, demand = [], [], [], [], [], []
    for code in np.unique(tenant_code[usable]):
        mine = np.flatnonzero(usable & (tenant_code == code))
        rows_by_pool, chance_by_pool, gh = [], [], []
        for r in range(len(pools)):
            pi = spread[mine, r]
            rows, pi = mine[pi > 0], pi[pi > 0]
            rows_by_pool.append(rows)
            chance_by_pool.append(pi / pi.sum() if pi.size else pi)
            gh.append(float((pi * weight[rows]).sum() / pi.sum()) if pi.size else 0.0)
        ids.append(f"{'elastic' if code >= k else 'rigid'}-{code % k:02d}")
        elastic.append(bool(code >= k))
        cells.append(tuple(rows_by_pool))
        chances.append(tuple(chance_by_pool))
        mean_gh.append(gh)
        demand.append(level_gpus * (spread[mine] * weight[mine, None]).sum(axis=0) / total)
    elastic_arr = np.array(elastic)
    elasticity = _elasticities(elastic_arr, economics)
    d0 = np.array(demand)
    twins = np.flatnonzero(elastic_arr) if economics.latent_elastic_ratio > 0 else np.zeros(0, dtype=np.int64)
    n = len(ids)
    ids += [f"latent-{ids[j].split('-')[1]}" for j in twins]
    cells += [cells[j] for j in twins]
    chances += [chances[j] for j in twins]
    mean_gh += [mean_gh[j] for j in twins]
    latent = np.concatenate([np.zeros(n, dtype=bool), np.ones(twins.size, dtype=bool)])
    elastic_arr = np.concatenate([elastic_arr, np.ones(twins.size, dtype=bool)])
    elasticity = np.concatenate([elasticity, elasticity[twins]])
    population = _population(ids, elastic_arr, elasticity, d0, pools, economics, twins)
    swing = economics.elasticity_tod_swing
    hourly = (
        tuple(
            _population(
                ids,
                elastic_arr,
                np.maximum(elasticity * tod_factor(h, swing), ELASTICITY_FLOOR),
                d0,
                pools,
                economics,
                twins,
            )
            for h in range(24)
        )
        if swing > 0
        else ()
    )
    d0 = np.concatenate([d0, np.zeros((twins.size, d0.shape[1]))])
    model = TenantModel(
        tuple(ids),
        elastic_arr,
        elasticity,
        tuple(cells),
        tuple(chances),
        np.array(mean_gh),
        d0,
        population,
        float(level_gpus),
        latent,
        hourly,
    )
    _check_calibration(model, pools)
    return model


def _population(
    ids: list[str],
    elastic: np.ndarray,
    elasticity: np.ndarray,
    d0: np.ndarray,
    pools: tuple[Pool, ...],
    economics: EconomicAssumptions,
    twins: np.ndarray | None = None,
) -> TenantPopulation:
    """Steps 3 and 5 of the calibration: rows of d0 (the trace's tenants), then one latent
    row per entry of `twins` (a trace tenant's row index)."""
    twins = np.zeros(0, dtype=np.int64) if twins is None else twins
    n, r = d0.shape
    t = n + twins.size
    list_price = np.array([p.prices.list_price for p in pools])
    eta = 2.0 / elasticity
    saturation = np.ones((t, 2 * r))
    weight = np.zeros((t, 2 * r))
    budget = np.zeros(t)
    ratio = economics.latent_elastic_ratio
    for j in range(t):
        cols = 2 * np.arange(r) + int(elastic[j])
        base = d0[j] if j < n else d0[twins[j - n]]
        wanted = base > 0
        if j < n:  # trace tenant: best response d0 at the list price p0
            size = base[wanted]
            weight[j, cols[wanted]] = list_price[wanted] * size * 2.0 ** eta[j]
            budget[j] = (1.0 + economics.budget_headroom) * (base * list_price).sum()
        else:  # latent twin: choke price p0, ratio * d0 of its twin at p0 / 2
            size = ratio * base[wanted] / (2.0 ** (1.0 / eta[j]) - 1.0)
            weight[j, cols[wanted]] = list_price[wanted] * size
            budget[j] = (1.0 + economics.budget_headroom) * (
                0.5 * list_price[wanted] * ratio * base[wanted]
            ).sum()
        saturation[j, cols[wanted]] = size
    drainable = np.tile([False, True], r)
    return TenantPopulation.build(
        ids=ids,
        families=["isoelastic"] * t,
        weight=weight,
        saturation=saturation,
        budget=budget,
        drainable_mask=drainable,
        eta=eta,
        drain_tolerant=elastic,
    )


def best_response(model: TenantModel, prices: np.ndarray, hour: int | None = None) -> np.ndarray:
    """(T, R) GPUs each tenant wants of its class's resource in each pool at `prices`
    (resource order, load index 1; a uniform load index k scales it by exactly k), at the
    UTC hour of day `hour` where the response varies over the day."""
    population = model.population_at(hour)
    state = solve_followers(population.on("cpu"), torch.as_tensor(np.asarray(prices, dtype=np.float64)))
    demand = state.demand.numpy()
    rows = np.arange(model.size)[:, None]
    cols = 2 * np.arange(demand.shape[1] // 2)[None, :] + model.class_column()[:, None]
    return demand[rows, cols]


def list_price_vector(pools: tuple[Pool, ...]) -> np.ndarray:
    return np.repeat([p.prices.list_price for p in pools], 2)


def _check_calibration(model: TenantModel, pools: tuple[Pool, ...]) -> None:
    """The calibration's contract: at the list prices every tenant demands d0."""
    gap = 0.0
    for hour in (None, *range(len(model.hourly))):
        got = np.maximum(best_response(model, list_price_vector(pools), hour), 0.0)
        gap = max(gap, np.abs(got - model.base_demand).max() / max(model.base_demand.max(), 1e-12))
    if gap > 1e-6:
        raise SimulationInputError(
            f"calibration failed: demand at the list price is off by {gap:.2e} (relative)"
        )
