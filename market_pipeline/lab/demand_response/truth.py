"""The truth-grid market: a small fixed fleet, tenants whose true price response is hidden
from the loop, and the grid of truth points the loop is judged on.

Two pools, each selling a guaranteed class (rigid tenants) and a drainable class (elastic
tenants). At hour h the true demand for a resource is one isoelastic tenant
(`tick.response.response_population`, the same construction the tick calibrates with) sized to
the load index k(h) x its base demand at the reference price, with the truth point's class
elasticity swinging +-`tod_swing` over the day (more elastic at night). A truth point with
`latent_ratio` > 0 adds the simulator's latent elastic demand (`simulate.tenants` step 5). The
loop sees only the prices it published and the demand they met (with noise).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.resources import DRAINABLE, GUARANTEED, ResourceSet
from market_pipeline.tick.response import reference_prices, response_population

SEED_POOLS = (  # pool id, list price per GPU-hour, GPUs
    ("A100@grid", 3.0, 64.0),
    ("T4@grid", 0.8, 96.0),
)
RIGID_SHARE, ELASTIC_SHARE = 0.5, 0.25  # of a pool's GPUs, at the list prices and load index 1
AVOIDABLE_COST_SHARE = 0.3  # what selling a GPU-hour adds to cost, per list price (idle GPUs are sunk)
PRICE_MIN_SHARE, PRICE_MAX_SHARE = 0.5, 1.5
NODE_GPUS = 8.0


@dataclass(frozen=True)
class TruthPoint:
    name: str
    elastic: float  # the elastic tenants' mean elasticity (stated range 0.2-3)
    rigid: float  # the rigid tenants' (0-0.5)
    latent_ratio: float = 0.0
    tod_swing: float = 0.3

    def elasticity(self, resource_class: str, hour: float) -> float:
        """The true elasticity of a class at an hour of the day."""
        centre = self.elastic if resource_class == DRAINABLE else self.rigid
        return centre * (1.0 + self.tod_swing * np.cos(2 * np.pi * (hour % 24 - 3) / 24))


def judged_points() -> tuple[TruthPoint, ...]:
    """The grid the targets are judged on: nothing was tuned on these."""
    points = [TruthPoint(f"e{e:g}/r{r:g}", e, r) for e in (0.2, 0.5, 1.0, 2.0, 3.0) for r in (0.0, 0.25, 0.5)]
    points.append(TruthPoint("latent-demand e2/r0.2 ratio1", 2.0, 0.2, latent_ratio=1.0))
    return tuple(points)


def tuning_points() -> tuple[TruthPoint, ...]:
    """Points the settings (amplitude, stop widths, refit cadence, priors) were chosen on."""
    return tuple(TruthPoint(f"tune e{e:g}/r{r:g}", e, r) for e in (0.35, 1.5, 2.5) for r in (0.1, 0.4))


@dataclass(frozen=True)
class GridMarket:
    resources: ResourceSet  # capacity inf: each tick sets it
    reference: np.ndarray  # per resource
    base_demand: np.ndarray  # per resource, at the reference prices, load index 1
    gpus: np.ndarray  # per pool
    list_price: np.ndarray  # per pool
    mid_discount: float

    @property
    def keys(self) -> list[str]:
        return [f"{p}/{c}" for p, c in zip(self.resources.pool, self.resources.resource_class)]

    def capacity(self, rigid_demand: np.ndarray) -> np.ndarray:
        """Guaranteed: the pool; drainable: what rigid demand leaves (at least 2% of the pool)."""
        out = np.empty(self.resources.size)
        out[0::2] = self.gpus
        out[1::2] = np.maximum(self.gpus - rigid_demand, 0.02 * self.gpus)
        return out

    def ceilings(self, promises) -> np.ndarray:
        """Per resource, the highest price the promises allow: the guaranteed cap, the band's top."""
        top = np.minimum(self.resources.price_max[0::2], promises.guaranteed_cap * self.list_price)
        return np.repeat(top, 2) * np.tile([1.0, 1.0 - promises.discount_min], self.list_price.size)

    def with_capacity(self, problem: MarketProblem, capacity: np.ndarray) -> MarketProblem:
        return MarketProblem(
            replace(problem.resources, capacity=np.asarray(capacity, dtype=np.float64)), problem.tenants
        )

    def population(self, elasticity: np.ndarray, scale: float, latent_ratio: float = 0.0):
        fitted = list(enumerate(np.asarray(elasticity, dtype=np.float64)))
        return response_population(
            self.resources, self.reference, scale * self.base_demand, fitted, latent_ratio=latent_ratio
        )


def grid_market(discount_min: float, discount_max: float) -> GridMarket:
    names, pools, classes, cost, low, high, dmin, dmax, base = [], [], [], [], [], [], [], [], []
    for pool_id, price, gpus in SEED_POOLS:
        for cls, share in ((GUARANTEED, RIGID_SHARE), (DRAINABLE, ELASTIC_SHARE)):
            names.append(f"{pool_id}/{cls}")
            pools.append(pool_id)
            classes.append(cls)
            cost.append(AVOIDABLE_COST_SHARE * price)
            low.append(PRICE_MIN_SHARE * price * ((1 - discount_max) if cls == DRAINABLE else 1.0))
            high.append(PRICE_MAX_SHARE * price * ((1 - discount_min) if cls == DRAINABLE else 1.0))
            dmin.append(discount_min if cls == DRAINABLE else 0.0)
            dmax.append(discount_max if cls == DRAINABLE else 0.0)
            base.append(share * gpus)
    size = len(names)
    resources = ResourceSet(
        tuple(names),
        np.full(size, np.inf),
        np.array(cost),
        np.array(low),
        np.array(high),
        tuple(classes),
        tuple(pools),
        np.array(dmin),
        np.array(dmax),
    )
    mid = 0.5 * (discount_min + discount_max)
    lists = np.array([p for _, p, _ in SEED_POOLS])
    return GridMarket(
        resources,
        reference_prices(np.repeat(lists, 2), tuple(classes), mid),
        np.array(base),
        np.array([g for _, _, g in SEED_POOLS]),
        lists,
        mid,
    )
