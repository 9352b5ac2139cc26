"""The simulator with hidden truth: the loop learns the demand response from its own prices
and experiments; a clairvoyant leader that knows the truth runs the same tick beside it.

Per truth point (`truth`): `history_days` of hourly history at the list prices (the loop
before it priced dynamically), then `days` of hourly ticks, three strategies on the same load
and the same demand noise:
- static: the list prices (drainable at the middle of the band);
- the loop: forecast the load index (`forecast.fit_and_forecast`, from demand converted to the
  reference prices with the current fit), refit the demand response every `refit_every` ticks
  (`estimator.fit_elasticity`, the configured claims as the prior), run the market tick with
  the fit (`tick.run_market_tick(response=...)`), then the running experiments' dither
  (`experiments.perturb_tick`);
- clairvoyant: the same tick on the true population at the true load, no experiments.
Profit is contribution: revenue minus the avoidable cost of the GPU-hours sold (the fleet is
fixed and powered, so its capacity cost is the same for every strategy). Sold GPUs: guaranteed
first, drainable from what is left of the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from market_pipeline.config.model import DemandResponseConfig
from market_pipeline.demand_response.experiments import ExperimentSettings
from market_pipeline.lab.demand_response.synthetic import load_shape
from market_pipeline.lab.demand_response.truth import GridMarket, TruthPoint
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import SolverSettings
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.market.solve import demand_at
from market_pipeline.tick import PoolTickInput, Promises
from market_pipeline.tick.certificate import BacklogParams

HOUR = 3600.0


@dataclass(frozen=True)
class GridSettings:
    days: int = 3
    history_days: int = 7
    refit_every: int = 6  # ticks (hours)
    forecast_every: int = 6
    noise: float = 0.03  # demand noise (log sd) the price never sees
    level_walk: float = 0.04  # the day's load level: a random walk (log sd per day)
    seed: int = 0
    shadow: bool = False  # experiments recorded, not published
    learn: bool = True  # False: the claims only (no fit, no experiment), the ablation
    experiments: ExperimentSettings = field(default_factory=ExperimentSettings)
    priors: dict = field(default_factory=lambda: {GUARANTEED: (0.2, 0.3), DRAINABLE: (2.0, 1.0)})
    promises: Promises = field(default_factory=Promises)
    solver: SolverSettings = field(default_factory=lambda: SolverSettings(tolerance=1e-6, max_iterations=300))
    # the estimator's settings: the live config's defaults (`[demand_response]`)
    lag_hours: float = field(default_factory=lambda: DemandResponseConfig().lag_hours)
    daily_cycle: bool = field(default_factory=lambda: DemandResponseConfig().daily_cycle)
    structure_alpha: float = field(default_factory=lambda: DemandResponseConfig().structure_alpha)


@dataclass
class Books:
    """Per strategy: money and GPU-hours by class."""

    revenue: float = 0.0
    profit: float = 0.0
    sold: np.ndarray = field(default_factory=lambda: np.zeros(2))  # guaranteed, drainable
    spend: np.ndarray = field(default_factory=lambda: np.zeros(2))
    capacity: float = 0.0

    def book(self, market: GridMarket, prices: np.ndarray, demand: np.ndarray) -> float:
        sold = sold_gpus(market, demand)
        money = prices * sold
        profit = float(((prices - market.resources.unit_cost) * sold).sum())
        self.revenue += float(money.sum())
        self.profit += profit
        self.sold += np.array([sold[0::2].sum(), sold[1::2].sum()])
        self.spend += np.array([money[0::2].sum(), money[1::2].sum()])
        self.capacity += float(market.gpus.sum())
        return profit

    def summary(self) -> dict[str, float]:
        return {
            "revenue": self.revenue,
            "profit": self.profit,
            "utilisation": float(self.sold.sum() / self.capacity),
            "rigid_cost_per_gpu_hour": float(self.spend[0] / max(self.sold[0], 1e-12)),
            "elastic_cost_per_gpu_hour": float(self.spend[1] / max(self.sold[1], 1e-12)),
        }


def sold_gpus(market: GridMarket, demand: np.ndarray) -> np.ndarray:
    out = np.empty_like(demand)
    out[0::2] = np.minimum(demand[0::2], market.gpus)
    out[1::2] = np.minimum(demand[1::2], market.gpus - out[0::2])
    return out


class TruthWorld:
    """The hidden truth of one point: load, true elasticities, demand noise."""

    def __init__(self, market: GridMarket, point: TruthPoint, settings: GridSettings, hours: int) -> None:
        rng = np.random.default_rng(settings.seed)
        self.market, self.point = market, point
        days = hours // 24 + 2
        level = np.exp(np.cumsum(rng.normal(0.0, settings.level_walk, days)))
        h = np.arange(hours)
        self.load = load_shape(h) * level[h // 24]
        self.noise = np.exp(rng.normal(0.0, settings.noise, (hours, market.resources.size)))

    def elasticity(self, hour: int) -> np.ndarray:
        return np.array([self.point.elasticity(c, hour) for c in self.market.resources.resource_class])

    def problem(self, hour: int) -> MarketProblem:
        pop = self.market.population(self.elasticity(hour), float(self.load[hour]), self.point.latent_ratio)
        return MarketProblem(self.market.resources, pop)

    def demand(self, hour: int, prices: np.ndarray) -> np.ndarray:
        return np.maximum(np.nan_to_num(demand_at(self.problem(hour), prices)), 0.0) * self.noise[hour]


def pool_inputs(
    market: GridMarket, in_force: np.ndarray, demand: np.ndarray, upper: np.ndarray, promises: Promises
) -> list[PoolTickInput]:
    out = []
    for i, (pool_id, price) in enumerate(zip(market.resources.pool[0::2], market.list_price)):
        out.append(
            PoolTickInput(
                pool_id=pool_id,
                list_price=float(price),
                price_min=float(market.resources.price_min[2 * i]),
                price_max=float(market.resources.price_max[2 * i]),
                node_gpus=8.0,
                serving_gpus=float(market.gpus[i]),
                reachable_gpus=float(market.gpus[i]),
                demand_gpus=float(demand[2 * i : 2 * i + 2].sum()),
                backlog_gpus=0.0,
                forecast_upper_gpus=float(upper[2 * i : 2 * i + 2].sum()),
                in_force_guaranteed=float(in_force[2 * i]),
                in_force_drainable=float(in_force[2 * i + 1]),
                forecast_price=float(in_force[2 * i]),
                backlog=BacklogParams(
                    price_min=float(market.resources.price_min[2 * i]),
                    price_max=float(market.resources.price_max[2 * i]),
                ),
            )
        )
    return out


def promise_breaches(market: GridMarket, promises: Promises, in_force: np.ndarray, prices: np.ndarray) -> int:
    """Published prices that break the guaranteed cap, the max step or the drainable band."""
    tol = 1e-7
    g, d = prices[0::2], prices[1::2]
    cap = g > promises.guaranteed_cap * market.list_price * (1 + tol)
    step = np.abs(prices / in_force - 1) > promises.max_step + tol
    band = (d > g * (1 - promises.discount_min) * (1 + tol)) | (
        d < g * (1 - promises.discount_max) * (1 - tol)
    )
    return int(cap.sum() + step.sum() + band.sum())
