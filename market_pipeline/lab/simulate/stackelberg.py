"""The Stackelberg strategy: the live loop's market tick (`tick.run_market_tick`) per tick.

1. Forecast (`forecast.fit_and_forecast`, refitted every few ticks) of the load index, the
   tenants' demand relative to the calibrated population, observed from job submissions.
2. The market: the calibrated population shifted by the forecast median. Guaranteed
   capacity is the pool times the packing efficiency; drainable capacity is what rigid jobs
   leave of it (running + waiting rigid GPUs now), because rigid demand may drain drainable
   jobs. A resource whose demand exceeds its capacity even at its highest price is given that
   demand as capacity: its best price is the highest one and the shortfall waits in the
   queue (the backlog guardrail's concern).
3. The shared tick solves it from the prices in force within the promises (the max step, the
   guaranteed cap, the drainable band: `[market]` in the config, the cap overridable by
   `EconomicAssumptions.guaranteed_cap`), then shields each pool at its fixed fleet with the
   forecast's upper quantile of demand at the prices in force and the waiting GPUs as the
   backlog; a raised price lifts both classes of the pool by the same factor.

With a `learner` (`simulate.learning`, the default "stackelberg"), `model` is the claims, not
the tenants: the tick is given the learned response (`response=`), the forecast the learner's
own load index, and the running experiments move the published prices. Without one
("clairvoyant"), `model` is the true population, hour by hour: the regret's yardstick.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.demand_response.experiments import ExperimentSettings
from market_pipeline.forecast.pool import fit_and_forecast
from market_pipeline.lab.simulate.learning import ResponseLearner
from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID, MarketView, PriceDecision
from market_pipeline.lab.simulate.settings import SimulationSettings
from market_pipeline.lab.simulate.tenants import Pool, TenantModel, list_price_vector, resource_set
from market_pipeline.market.followers import solve_followers
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.market.solve import demand_at
from market_pipeline.tick import PoolTickInput, Promises, guarantee_reach, run_market_tick
from market_pipeline.tick.certificate import BacklogParams
from market_pipeline.tick.pricing import drainable_capacity, solver_settings

if TYPE_CHECKING:
    from market_pipeline.lab.simulate.run_inputs import RunInputs

MIN_INDEX = 1e-3


class StackelbergPricing:
    drains = True

    def __init__(
        self,
        model: TenantModel,
        pools: tuple[Pool, ...],
        config: MarketPipelineConfig,
        settings: SimulationSettings,
        *,
        learner: ResponseLearner | None = None,
        epoch: dt.datetime | None = None,
        name: str = "stackelberg",
    ) -> None:
        self.name = name
        self.model = model
        self.learner = learner
        self.epoch_s = 0.0 if epoch is None else epoch.timestamp()
        self.pools = pools
        self.config = config
        self.settings = settings
        self.solver = solver_settings(config)  # the live pipeline's solver settings
        self.promises = Promises.from_config(config, guaranteed_cap=settings.economics.guaranteed_cap)
        self.efficiency = settings.economics.packing_efficiency
        # the drainable class leaves the guaranteed claim expected at the prices in force too
        self.expect_claim = config.guardrails.rigid_guarantee.drainable_leaves_expected_claim
        # where the tenants' level is stated: `simulate.tenants` calibrates both classes at the
        # list price, so a fitted response curve passes through the demand there
        self.level_prices = list_price_vector(pools)
        self._forecast: tuple[int, np.ndarray, np.ndarray] | None = None
        backlog = config.guardrails.backlog
        self.params = [
            BacklogParams(
                residual_share=backlog.residual_floor_share,
                elasticity=backlog.price_elasticity,
                margin_fraction=backlog.drift_margin,
                min_margin_gpus=backlog.drift_margin_min_gpus,
                price_min=p.prices.price_min,
                price_max=p.prices.guaranteed_max,
            )
            for p in pools
        ]
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
            if self.learner is not None:  # the trace before the window, then the loop's own estimate
                history = np.concatenate([history[: history.size - view.tick], self.learner.index])
            fc = fit_and_forecast(
                history,
                step_minutes=self.settings.tick_minutes,
                horizon_steps=every,
                prior=float(np.nanmean(history)) if np.isfinite(history).any() else 1.0,
            )
            self._forecast = (view.tick, fc.q50, fc.q90)
        start, q50, q90 = self._forecast
        step = min(view.tick - start, q50.size - 1)
        median = max(float(q50[step]), MIN_INDEX)
        return median, max(float(q90[step]), median)

    # -- the tick ---------------------------------------------------------------------------
    def decide(self, view: MarketView) -> PriceDecision:
        hour = int(((self.epoch_s + view.time_s) % 86_400) // 3600)
        response: dict[str, float] = {}
        observed: dict[str, tuple[float, float]] = {}
        if self.learner is not None:
            self.learner.observe(
                view.tick,
                view.time_s - self.settings.tick_seconds,
                view.last_prices,
                view.bought,
                self.settings.tick_seconds / 3600.0,
            )
            self.learner.maybe_refit(view.tick)
            response = self.learner.response(hour)
            observed = self.learner.observed(hour)
        median, upper = self._index_forecast(view)
        population = self.model.population if self.learner is not None else self.model.population_at(hour)
        # what the tenants buy at the prices in force (the forecast's median): the guaranteed
        # class's expected claim on each pool, and the base of the forecast's upper quantile
        in_force = np.asarray(view.last_prices, dtype=np.float64)
        at_in_force = np.nan_to_num(
            demand_at(MarketProblem(resource_set(self.pools), population).with_demand_scale(median), in_force)
        )
        expected = at_in_force[0::2] if self.expect_claim else np.zeros(len(self.pools))
        capacity = np.maximum(self._capacities(view, expected), median * self._demand_at_max * (1.0 + 1e-3))
        problem = MarketProblem(resource_set(self.pools, capacity), population).with_demand_scale(median)
        inputs = self._pool_inputs(view, at_in_force, upper / median)
        tick = run_market_tick(
            inputs,
            problem,
            self.promises,
            self.solver,
            response=response,
            level_prices=self.level_prices,
            observed=observed,
        )
        if self.learner is not None and view.bought is not None:  # not in the opening rounds
            tick = self.learner.experiment(view.tick, hour, tick, inputs, problem, response)
        self.solves[tick.status] = self.solves.get(tick.status, 0) + 1
        self.solve_seconds += tick.report.seconds if tick.report is not None else 0.0
        self.shielded += sum(r.shielded for r in tick.pools)
        self.undrainable += sum(not r.certified for r in tick.pools)
        notes = [f"{r.pool_id}: {r.guaranteed_reason}" for r in tick.pools if r.shielded or not r.certified]
        info: dict[str, Any] = {
            "status": tick.status,
            "index_median": median,
            "index_upper": upper,
            "kkt": tick.report.kkt_residual if tick.report is not None else 0.0,
            "shield": notes,
        }
        return PriceDecision(tick.prices(), info)

    def _pool_inputs(self, view: MarketView, at_in_force: np.ndarray, spread: float) -> list[PoolTickInput]:
        """Each pool's fixed fleet, its demand and backlog now, and the forecast's upper quantile
        of what the tenants buy at the prices in force (`at_in_force`, at the median)."""
        out = []
        for r, pool in enumerate(self.pools):
            g, d = 2 * r, 2 * r + 1
            out.append(
                PoolTickInput(
                    pool_id=pool.pool_id,
                    list_price=pool.prices.list_price,
                    price_min=pool.prices.price_min,
                    price_max=pool.prices.price_max,
                    node_gpus=float(pool.max_node_gpus),
                    serving_gpus=float(view.capacity[r]),
                    reachable_gpus=float(view.capacity[r]),
                    demand_gpus=float(view.demand[r]),
                    backlog_gpus=max(float(view.pending[r].sum()), 0.0),  # float drift: -1e-15
                    forecast_upper_gpus=float((at_in_force[g] + at_in_force[d]) * spread),
                    in_force_guaranteed=float(view.last_prices[g]),
                    in_force_drainable=float(view.last_prices[d]),
                    forecast_price=float(view.last_prices[g]),
                    backlog=self.params[r],
                    guarantee_reach=guarantee_reach(view.allocated[r, ELASTIC], view.pending[r, RIGID]),
                )
            )
        return out

    def _capacities(self, view: MarketView, guaranteed_expected: np.ndarray) -> np.ndarray:
        """Guaranteed: the usable pool. Drainable: what the guaranteed class's claim leaves of it
        (`tick.pricing.drainable_capacity`, the live tick's rule): the rigid GPUs running and
        waiting now, or those the tenants are expected to hold, whichever is more."""
        usable = self.efficiency * view.capacity
        rigid = view.allocated[:, RIGID] + view.pending[:, RIGID]
        drainable = drainable_capacity(usable, rigid, guaranteed_expected)
        out = np.empty(2 * len(self.pools))
        out[0::2], out[1::2] = usable, drainable
        return out

    def summary(self) -> dict[str, Any]:
        out = {
            "solves": dict(self.solves),
            "shielded_ticks": self.shielded,
            "undrainable_pool_ticks": self.undrainable,
            "solve_seconds": round(self.solve_seconds, 3),
        }
        if self.learner is not None:
            out["learning"] = self.learner.summary()
        return out


def learning_strategy(inputs: RunInputs) -> StackelbergPricing:
    """The Stackelberg strategy as the live loop runs it: the claims as the prior, the response
    learned from its own prices (`learner`), bounded experiments; `learn_response` False: the
    claims alone."""
    s, pools = inputs.settings, inputs.pools
    claims = inputs.claims if inputs.claims is not None else inputs.model
    if not s.learn_response:
        return StackelbergPricing(claims, pools, inputs.config, s, epoch=inputs.epoch)
    res = resource_set(pools)
    dr = inputs.config.demand_response
    experiments = ExperimentSettings(
        amplitude=s.experiment_amplitude,
        stop_relative_width=dr.stop_relative_width,
        stop_absolute_width=dr.stop_absolute_width,
        level=dr.interval_level,
        seed=s.seed,
    )
    strategy = StackelbergPricing(claims, pools, inputs.config, s, epoch=inputs.epoch)
    strategy.learner = ResponseLearner(
        tuple(p.pool_id for p in pools),
        np.repeat([p.prices.list_price for p in pools], 2),
        res.unit_cost,
        res.price_max,
        inputs.base_requested,
        inputs.epoch,
        {GUARANTEED: s.claims_rigid, DRAINABLE: s.claims_elastic},
        s.refit_every_ticks,
        experiments,
        strategy.promises,
        lag_hours=dr.lag_hours,
        daily_cycle=dr.daily_cycle,
        structure_alpha=dr.structure_alpha,
        observed_budget=dr.observed_budget,
    )
    return strategy


__all__ = ["ELASTIC", "RIGID", "StackelbergPricing", "learning_strategy"]
