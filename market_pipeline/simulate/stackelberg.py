"""The Stackelberg strategy: the live pipeline's forecast -> solve -> certify chain per tick.

1. Forecast (`forecast.fit_and_forecast`, refitted every few ticks) of the load index, the
   tenants' demand relative to the calibrated population, observed from job submissions.
2. Solve (`market.solve_equilibrium`) on the calibrated population shifted by the forecast
   median, warm-started from and step-limited against the last prices. Guaranteed capacity
   is the pool times the packing efficiency; drainable capacity is what rigid jobs leave
   of it (running + waiting rigid GPUs now), because rigid demand may drain drainable jobs.
   A resource whose demand exceeds its capacity even at its highest price is given that
   demand as capacity: its best price is the highest one and the shortfall waits in the
   queue (the backlog guardrail's concern). The engine is meant to report such a resource
   as `capacity_infeasible`; on these instances it failed to converge instead (fallback to
   the last prices after ~15 s), so the simulator states the bound explicitly.
3. Certify (`guardrails.backlog.shield`) each pool at the equilibrium guaranteed price with
   the forecast's upper quantile of demand, the waiting GPUs as backlog and the fixed fleet
   as the maximum capacity; a raised price lifts both classes of the pool by the same factor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.forecast import fit_and_forecast
from market_pipeline.guardrails.backlog import BacklogParams, BacklogState, PriceCapacityAction, shield
import torch

from market_pipeline.market import MarketProblem, solve_equilibrium, solve_followers
from market_pipeline.pricing import solver_settings
from market_pipeline.simulate.pricing import ELASTIC, RIGID, MarketView, PriceDecision
from market_pipeline.simulate.settings import SimulationSettings
from market_pipeline.simulate.tenants import Pool, TenantModel, resource_set

MIN_INDEX = 1e-3
DRAINABLE_CAPACITY_FLOOR = 0.02  # share of the pool: the drainable class is never sold out by rule


class StackelbergPricing:
    name = "stackelberg"
    drains = True

    def __init__(self, model: TenantModel, pools: tuple[Pool, ...], config: MarketPipelineConfig,
                 settings: SimulationSettings) -> None:
        self.model = model
        self.pools = pools
        self.config = config
        self.settings = settings
        self.solver = solver_settings(config)  # the live pipeline's solver settings
        self.max_step = config.market.max_price_step
        self.efficiency = settings.economics.packing_efficiency
        self._forecast: tuple[int, np.ndarray, np.ndarray] | None = None
        backlog = config.guardrails.backlog
        self.params = [BacklogParams(residual_share=backlog.residual_floor_share,
                                     elasticity=backlog.price_elasticity, margin_fraction=backlog.drift_margin,
                                     min_margin_gpus=backlog.drift_margin_min_gpus,
                                     price_min=p.prices.price_min, price_max=p.prices.guaranteed_max)
                       for p in pools]
        self.solves = {"converged": 0, "capacity_infeasible": 0, "fallback": 0}
        top = torch.as_tensor(resource_set(pools).price_max)
        population = model.population.on("cpu")
        self._demand_at_max = population.aggregate(solve_followers(population, top).demand).numpy()
        self.shielded = 0
        self.undrainable = 0
        self.solve_seconds = 0.0

    # -- forecast ---------------------------------------------------------------------------
    def _index_forecast(self, view: MarketView) -> tuple[float, float]:
        every = self.settings.forecast_every_ticks
        if self._forecast is None or view.tick - self._forecast[0] >= every:
            history = view.index_history
            fc = fit_and_forecast(history, step_minutes=self.settings.tick_minutes, horizon_steps=every,
                                  prior=float(np.nanmean(history)) if np.isfinite(history).any() else 1.0)
            self._forecast = (view.tick, fc.q50, fc.q90)
        start, q50, q90 = self._forecast
        step = min(view.tick - start, q50.size - 1)
        median = max(float(q50[step]), MIN_INDEX)
        return median, max(float(q90[step]), median)

    # -- the tick ---------------------------------------------------------------------------
    def decide(self, view: MarketView) -> PriceDecision:
        median, upper = self._index_forecast(view)
        capacity = np.maximum(self._capacities(view), median * self._demand_at_max * (1.0 + 1e-3))
        problem = MarketProblem(resource_set(self.pools, capacity), self.model.population).with_demand_scale(median)
        report = solve_equilibrium(problem, last_prices=view.last_prices, max_step=self.max_step,
                                   settings=self.solver)
        self.solves[report.status] = self.solves.get(report.status, 0) + 1
        self.solve_seconds += report.seconds
        prices = np.array(report.prices, dtype=np.float64)
        demand = np.nan_to_num(np.asarray(report.demand, dtype=np.float64))
        shield_notes = self._shield(view, prices, demand, upper / median)
        info: dict[str, Any] = {"status": report.status, "index_median": median, "index_upper": upper,
                                "kkt": report.kkt_residual, "shield": shield_notes}
        return PriceDecision(prices, info)

    def _capacities(self, view: MarketView) -> np.ndarray:
        usable = self.efficiency * view.capacity
        rigid = view.allocated[:, RIGID] + view.pending[:, RIGID]
        drainable = np.maximum(usable - rigid, DRAINABLE_CAPACITY_FLOOR * usable)
        out = np.empty(2 * len(self.pools))
        out[0::2], out[1::2] = usable, drainable
        return out

    def _shield(self, view: MarketView, prices: np.ndarray, demand: np.ndarray, spread: float) -> list[str]:
        notes = []
        for r, pool in enumerate(self.pools):
            g, d = 2 * r, 2 * r + 1
            forecast = max((demand[g] + demand[d]) * spread, float(view.demand[r]))
            state = BacklogState(pool=pool.pool_id, demand_forecast_gpus=forecast, reference_price=prices[g],
                                 backlog_gpus=max(float(view.pending[r].sum()), 0.0),  # float drift: -1e-15
                                 max_capacity_gpus=float(view.capacity[r]),
                                 capacity_step_gpus=float(pool.max_node_gpus))
            result = shield(PriceCapacityAction(prices[g], float(view.capacity[r])), state, self.params[r])
            if not result.feasible:
                self.undrainable += 1
            if result.price > prices[g] * (1 + 1e-12):
                self.shielded += 1
                factor = result.price / prices[g]
                prices[g] = result.price
                high = (1.0 - pool.prices.discount_min) * prices[g]
                prices[d] = min(prices[d] * factor, high)
                notes.append(f"{pool.pool_id}: {result.why[-1]}")
        return notes

    def summary(self) -> dict[str, Any]:
        return {"solves": dict(self.solves), "shielded_ticks": self.shielded,
                "undrainable_pool_ticks": self.undrainable, "solve_seconds": round(self.solve_seconds, 3)}


__all__ = ["ELASTIC", "RIGID", "StackelbergPricing"]
