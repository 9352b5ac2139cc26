"""What the simulator's Stackelberg strategy knows of the tenants' response: only its own
prices and the demand they met, learned the way the live loop learns it.

The tenants' true response (`EconomicAssumptions`: the class elasticities, their spread, the
time-of-day swing, the latent demand) is hidden: the strategy prices with the claims
(`SimulationSettings.claims_*`) as the prior and, every `refit_every_ticks`, refits the
elasticity per pool x class with the live loop's estimator (`demand_response.estimator.fit_elasticity`,
which `fit_history` calls per pool x class: the fixed-effects log-log fit, the claims as the prior) on the hourly (price, demand) it
observed. Its demand is the GPUs requested by the jobs submitted in the hour, per pool x class:
the work that bought at the hour's price. (GPU-hours billed in the hour are mostly jobs that
bought at earlier prices: openb's GPU-hour-weighted runtimes are days to weeks, so the billed
stock hardly moves with the hour's price and a fit on it reads an elasticity near zero.)
The fit goes to the market tick as `run_market_tick(response=...)`, exactly as the live
tick passes `demand_response.live.tick_response`'s; each resource whose interval is not yet
narrow runs the bounded experiment (`demand_response.experiments.perturb_tick`, the stop
rule `interval_narrow`), with the cost the loop's model gives it (`dither_cost`).

The load level the forecast sees is the demand converted to the list prices with the
current fit, over the trace's list-price demand: the loop's own estimate, not the truth's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from market_pipeline.demand_response.estimator import STRUCTURE_ALPHA, ResponseFit, fit_elasticity
from market_pipeline.demand_response.experiments import (
    ExperimentSettings,
    dither_cost,
    interval_narrow,
    perturb_tick,
)
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick import MarketTick, PoolTickInput, Promises
from market_pipeline.tick.response import response_key


class ResponseLearner:
    """The loop's observations, fits and experiments over one strategy run."""

    def __init__(
        self,
        pool_ids: tuple[str, ...],
        list_prices: np.ndarray,
        unit_cost: np.ndarray,
        ceiling: np.ndarray,
        base_requested: np.ndarray,
        epoch: dt.datetime,
        priors: dict[str, tuple[float, float]],
        refit_every: int,
        experiments: ExperimentSettings,
        promises: Promises,
        lag_hours: float = 0.0,
        daily_cycle: bool = False,
        structure_alpha: float = STRUCTURE_ALPHA,
        observed_budget: str = "off",
    ) -> None:
        self.keys = [response_key(p, c) for p in pool_ids for c in (GUARANTEED, DRAINABLE)]
        self.pool = [p for p in pool_ids for _ in (GUARANTEED, DRAINABLE)]
        self.cls = [c for _ in pool_ids for c in (GUARANTEED, DRAINABLE)]
        self.list_prices = np.asarray(list_prices, dtype=np.float64)  # per resource
        self.unit_cost, self.ceiling = np.asarray(unit_cost), np.asarray(ceiling)
        self.base_requested = np.asarray(base_requested, dtype=np.float64)  # per resource, list prices, k = 1
        self.epoch_s = epoch.timestamp()
        self.priors = {k: priors[c] for k, c in zip(self.keys, self.cls)}
        self.refit_every, self.settings, self.promises = refit_every, experiments, promises
        # the live config's `demand_response`
        self.lag_hours, self.daily_cycle, self.structure_alpha = lag_hours, daily_cycle, structure_alpha
        self.observed_budget = observed_budget  # `demand_response.observed_budget`
        self.ts: list[float] = []
        self.prices: list[np.ndarray] = []
        self.demand: list[np.ndarray] = []
        self.index: list[float] = []
        self.fits: dict[str, ResponseFit] = {}
        self.fit_log: list[dict[str, Any]] = []  # per refit: tick and elasticity per key
        self.experiment_log: list[dict[str, Any]] = []  # per experiment tick: the tick's and published prices
        self.experiment_ticks = {k: 0 for k in self.keys}
        self.model_cost = 0.0  # the loop's own estimate of what its experiments gave up (profit x hours)
        self.last_refit: int | None = None

    # -- observing ---------------------------------------------------------------------------
    def observe(
        self, tick: int, time_s: float, prices: np.ndarray, bought: np.ndarray | None, hours: float
    ) -> None:
        """The last tick's published prices and the GPUs its submitted jobs requested (per hour)."""
        if bought is None or tick < 1:
            return
        demand = np.asarray(bought, dtype=np.float64) / hours
        self.ts.append(self.epoch_s + time_s)
        self.prices.append(np.asarray(prices, dtype=np.float64).copy())
        self.demand.append(demand)
        hour = (self.ts[-1] % 86_400.0) / 3600.0
        self.index.append(self._index(self.prices[-1], demand, hour))

    def _index(self, prices: np.ndarray, demand: np.ndarray, hour: float) -> float:
        """The load index: demand at the list prices by the current fit, over the trace's."""
        e = self.elasticities(hour)
        at_list = demand * (prices / self.list_prices) ** e
        return float(at_list.sum() / max(self.base_requested.sum(), 1e-12))

    def elasticities(self, hour: float) -> np.ndarray:
        return np.array(
            [
                self.fits[k].at_hour(hour)
                if k in self.fits and self.fits[k].elasticity is not None
                else self.priors[k][0]
                for k in self.keys
            ]
        )

    # -- fitting -----------------------------------------------------------------------------
    def maybe_refit(self, tick: int) -> None:
        if len(self.ts) < 2 or (self.last_refit is not None and tick - self.last_refit < self.refit_every):
            return
        self.last_refit = tick
        ts, prices, demand = np.array(self.ts), np.array(self.prices), np.array(self.demand)
        # numpy, not `fit_history`'s polars frame: the strategies run in forked workers, where
        # a polars thread pool started by the parent (the trace readers) would deadlock
        self.fits = {
            k: fit_elasticity(
                ts,
                prices[:, r],
                demand[:, r],
                pool_id=self.pool[r],
                resource_class=self.cls[r],
                prior=self.priors[k],
                level=self.settings.level,
                lag_hours=self.lag_hours,
                daily_cycle=self.daily_cycle,
                structure_alpha=self.structure_alpha,
            )
            for r, k in enumerate(self.keys)
        }
        self.fit_log.append(
            {
                "tick": tick,
                **{k: (f.elasticity, f.elasticity_low, f.elasticity_high) for k, f in self.fits.items()},
            }
        )

    def response(self, hour: float) -> dict[str, float]:
        """What the tick calibrates to at an hour of the day (UTC): the fits that have an
        elasticity, on their daily cycle (as `tick_response`)."""
        return {
            k: float(f.at_hour(hour))
            for k, f in self.fits.items()
            if f.elasticity is not None and f.method != "none"
        }

    def observed(self, hour: float) -> dict[str, tuple[float, float]]:
        """Per fit the data spoke in, the low end of its observed prices and its elasticity at the
        hour (`ResponseFit.observed_at`, as `tick_response_observed`; none while
        `observed_budget` is "off")."""
        out: dict[str, tuple[float, float]] = {}
        if self.observed_budget == "off":
            return out
        for k, f in self.fits.items():
            seen = f.observed_at(hour, self.observed_budget) if f.elasticity is not None else None
            if seen is not None:
                out[k] = seen
        return out

    def running(self) -> set[str]:
        """The resources whose experiment runs: fitted, and the interval not yet narrow."""
        return {
            k
            for r, k in enumerate(self.keys)
            if k in self.fits
            and not interval_narrow(
                self.fits[k], self.settings, float(self.unit_cost[r]), float(self.ceiling[r])
            )
        }

    # -- experimenting -----------------------------------------------------------------------
    def experiment(
        self,
        tick: int,
        hour: int,
        result: MarketTick,
        pools: list[PoolTickInput],
        problem: MarketProblem,
        response: dict[str, float],
    ) -> MarketTick:
        """The tick to publish: its prices moved by the running experiments (none: unchanged)."""
        running = self.running()
        if not running:
            return result
        moved, steps = perturb_tick(result, pools, self.promises, running, self.settings, slot=tick)
        if not steps:
            return result
        for s in steps:
            self.experiment_ticks[s.key] += 1
        self.model_cost += dither_cost(
            problem,
            self.list_prices,
            self.promises,
            response,
            result.prices(),
            moved.prices(),
            level_prices=self.list_prices,  # the simulator's tenants are calibrated at the list price
            observed=self.observed(hour),
        )
        self.experiment_log.append(
            {
                "tick": tick,
                "hour": hour,
                "tick_prices": result.prices().tolist(),
                "published": moved.prices().tolist(),
            }
        )
        return moved

    def summary(self) -> dict[str, Any]:
        return {
            "refits": len(self.fit_log),
            "observations": len(self.ts),
            "final_fits": {
                k: {
                    "elasticity": f.elasticity,
                    "low": f.elasticity_low,
                    "high": f.elasticity_high,
                    "cycle_cos": f.elasticity_cos,
                    "cycle_sin": f.elasticity_sin,
                    "method": f.method,
                    "observations": f.observations,
                }
                for k, f in self.fits.items()
            },
            "experiment_ticks": self.experiment_ticks,
            "experiment_model_cost": self.model_cost,
            "fit_log": self.fit_log,
            "experiment_log": self.experiment_log,
        }


def requested_at_list(
    base_demand: np.ndarray,
    mean_gpu_hours: np.ndarray,
    elastic: np.ndarray,
    pods_by_cell,
    cell_weights,
    pod_gpus: np.ndarray,
) -> np.ndarray:
    """(2R,) GPUs the trace's jobs request per hour at the list prices and load index 1, per
    pool x class (Little's law: d0 / E[gL] jobs an hour, E[g] GPUs each): the trace's demand
    flow, the learner's yardstick for the load index (no tenant response in it)."""
    t, r = base_demand.shape
    out = np.zeros(2 * r)
    for j in range(t):
        for q in range(r):
            if base_demand[j, q] > 0 and mean_gpu_hours[j, q] > 0:
                mean_gpus = float((cell_weights[j][q] * pod_gpus[pods_by_cell[j][q]]).sum())
                out[2 * q + int(elastic[j])] += base_demand[j, q] / mean_gpu_hours[j, q] * mean_gpus
    return out
