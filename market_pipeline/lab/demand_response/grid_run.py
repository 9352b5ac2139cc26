"""Runs the truth grid (`truth_grid`): one truth point, or the grid with its targets."""

from __future__ import annotations

import time
from dataclasses import replace
from statistics import median
from typing import Any

import numpy as np

from market_pipeline.demand_response.estimator import ResponseFit, fit_elasticity
from market_pipeline.demand_response.experiments import interval_narrow, model_profit, perturb_tick
from market_pipeline.forecast.pool import fit_and_forecast
from market_pipeline.lab.demand_response.truth import TruthPoint, grid_market
from market_pipeline.lab.demand_response.truth_grid import (
    HOUR,
    Books,
    GridSettings,
    TruthWorld,
    pool_inputs,
    promise_breaches,
)
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.solve import demand_at
from market_pipeline.tick import run_market_tick
from market_pipeline.tick.response import calibrated_to_response

EPOCH = 1_772_409_600.0  # 2026-03-02T00:00:00Z, a Monday


class LoopLearner:
    """What the loop knows: its own prices and the demand they met; its fits and forecast."""

    def __init__(self, world: TruthWorld, settings: GridSettings) -> None:
        self.market, self.settings = world.market, settings
        self.prices: list[np.ndarray] = []
        self.demand: list[np.ndarray] = []
        self.fits: dict[str, ResponseFit] = {}
        self.forecast: tuple[int, np.ndarray, np.ndarray] | None = None

    def observe(self, prices: np.ndarray, demand: np.ndarray) -> None:
        self.prices.append(np.asarray(prices, dtype=np.float64))
        self.demand.append(np.asarray(demand, dtype=np.float64))

    def elasticity(self) -> np.ndarray:
        res = self.market.resources
        return np.array(
            [
                self.fits[k].elasticity if k in self.fits else self.settings.priors[c][0]
                for k, c in zip(self.market.keys, res.resource_class)
            ],
            dtype=np.float64,
        )

    def refit(self) -> None:
        ts = EPOCH + HOUR * np.arange(len(self.prices))
        p, d = np.array(self.prices), np.array(self.demand)
        res = self.market.resources
        for r, (key, cls) in enumerate(zip(self.market.keys, res.resource_class)):
            self.fits[key] = fit_elasticity(
                ts,
                p[:, r],
                d[:, r],
                pool_id=res.pool[r],
                resource_class=cls,
                prior=self.settings.priors[cls],
                lag_hours=self.settings.lag_hours,
                daily_cycle=self.settings.daily_cycle,
                structure_alpha=self.settings.structure_alpha,
            )

    def load_index(self, hour: int) -> tuple[float, float]:
        """The forecast's (median, upper) load index for `hour` (the next one to price)."""
        every = self.settings.forecast_every
        if self.forecast is None or hour - self.forecast[0] >= every:
            # demand at the reference prices by the current fit: the load, price effect removed
            e = self.elasticity()
            p, d = np.array(self.prices), np.array(self.demand)
            index = (d * (p / self.market.reference) ** e).sum(axis=1) / self.market.base_demand.sum()
            fc = fit_and_forecast(index, step_minutes=60, horizon_steps=1, prior=float(np.mean(index)))
            self.forecast = (hour, fc.coarse_q50, fc.coarse_q90)
        start, q50, q90 = self.forecast
        step = min(hour - start, q50.size - 1)
        return max(float(q50[step]), 1e-3), max(float(q90[step]), float(q50[step]), 1e-3)


def run_point(point: TruthPoint, settings: GridSettings = GridSettings()) -> dict[str, Any]:
    """The three strategies over one truth point's `days` after `history_days` at list prices."""
    started = time.perf_counter()
    promises = settings.promises
    market = grid_market(promises.discount_min, promises.discount_max)
    first, hours = settings.history_days * 24, (settings.history_days + settings.days) * 24
    world = TruthWorld(market, point, settings, hours)
    loop = LoopLearner(world, settings)
    for h in range(first):  # before dynamic pricing: the list prices, no experiment
        loop.observe(market.reference, world.demand(h, market.reference))
    books = {"static": Books(), "loop": Books(), "clairvoyant": Books()}
    in_force = {"loop": market.reference.copy(), "clairvoyant": market.reference.copy()}
    ceilings = market.ceilings(promises)
    cost_model = cost_true = 0.0
    breaches, experiment_ticks, errors = 0, {k: 0 for k in market.keys}, []
    for h in range(first, hours):
        books["static"].book(market, market.reference, world.demand(h, market.reference))
        if settings.learn and (h - first) % settings.refit_every == 0:
            loop.refit()
            errors.append(_errors(h - first, loop.fits, world, market))
        # -- the loop: forecast -> demand response -> solve -> shield -> experiments
        k50, k90 = loop.load_index(h)
        claims = market.population(
            np.array([settings.priors[c][0] for c in market.resources.resource_class]), k50
        )
        problem = market.with_capacity(
            MarketProblem(market.resources, claims), market.capacity(k50 * market.base_demand[0::2])
        )
        response = {k: f.at_hour(h % 24) for k, f in loop.fits.items() if f.elasticity is not None}
        inputs = pool_inputs(
            market, in_force["loop"], k50 * market.base_demand, k90 * market.base_demand, promises
        )
        tick = run_market_tick(inputs, problem, promises, settings.solver, response=response)
        running = {
            k
            for r, (k, f) in enumerate(zip(market.keys, map(loop.fits.get, market.keys)))
            if f is not None
            and not interval_narrow(
                f, settings.experiments, float(market.resources.unit_cost[r]), ceilings[r]
            )
        }
        perturbed, steps = perturb_tick(tick, inputs, promises, running, settings.experiments, slot=h)
        published = tick.prices() if settings.shadow else perturbed.prices()
        for s in steps:
            experiment_ticks[s.key] += 1
        demand = world.demand(h, published)
        profit = books["loop"].book(market, published, demand)
        if steps and not settings.shadow:
            calibrated = calibrated_to_response(problem, market.reference, response)
            cost_model += model_profit(calibrated, tick.prices()) - model_profit(calibrated, published)
            cost_true += Books().book(market, tick.prices(), world.demand(h, tick.prices())) - profit
        breaches += promise_breaches(market, promises, in_force["loop"], published)
        in_force["loop"] = published
        loop.observe(published, demand)
        # -- the clairvoyant leader: the same tick on the truth
        truth = world.problem(h)
        rigid_now = np.maximum(np.nan_to_num(demand_at(truth, in_force["clairvoyant"])), 0.0)
        truth = market.with_capacity(truth, market.capacity(rigid_now[0::2]))
        c_inputs = pool_inputs(market, in_force["clairvoyant"], rigid_now, rigid_now, promises)
        c_prices = run_market_tick(c_inputs, truth, promises, settings.solver).prices()
        books["clairvoyant"].book(market, c_prices, world.demand(h, c_prices))
        in_force["clairvoyant"] = c_prices
    return _point_report(
        point,
        books,
        cost_model,
        cost_true,
        breaches,
        experiment_ticks,
        errors,
        loop,
        time.perf_counter() - started,
    )


def _errors(tick: int, fits: dict[str, ResponseFit], world: TruthWorld, market) -> dict[str, Any]:
    """Each fit against the day's mean true elasticity of its class."""
    day_mean = np.mean([world.elasticity(h) for h in range(24)], axis=0)
    out: dict[str, Any] = {"tick": tick}
    for r, key in enumerate(market.keys):
        f = fits.get(key)
        out[key] = None if f is None or f.elasticity is None else round(f.elasticity - float(day_mean[r]), 4)
    return out


def _point_report(
    point: TruthPoint,
    books: dict[str, Books],
    cost_model: float,
    cost_true: float,
    breaches: int,
    experiment_ticks: dict[str, int],
    errors: list,
    loop: LoopLearner,
    seconds: float,
) -> dict[str, Any]:
    s = {name: b.summary() for name, b in books.items()}
    static, ours, best = s["static"], s["loop"], s["clairvoyant"]

    def vs_static(row: dict[str, float]) -> dict[str, float]:
        return {
            "revenue_x": row["revenue"] / static["revenue"],
            "profit_x": row["profit"] / static["profit"],
            "utilisation": row["utilisation"],
            "elastic_cost_x": row["elastic_cost_per_gpu_hour"] / static["elastic_cost_per_gpu_hour"],
            "rigid_cost_x": row["rigid_cost_per_gpu_hour"] / static["rigid_cost_per_gpu_hour"],
        }

    return {
        "point": point.name,
        "elastic": point.elastic,
        "rigid": point.rigid,
        "latent_ratio": point.latent_ratio,
        "static": static,
        "loop": ours,
        "clairvoyant": best,
        "loop_vs_static": vs_static(ours),
        "clairvoyant_vs_static": vs_static(best),
        "regret_share": (best["profit"] - ours["profit"]) / best["profit"],
        "experiment_cost_share": cost_true / ours["revenue"],
        "experiment_cost_model_share": cost_model / ours["revenue"],
        "experiment_ticks": experiment_ticks,
        "promise_breaches": breaches,
        "revenue_ge_static": ours["revenue"] >= static["revenue"],
        "final_fits": {
            k: {
                "elasticity": f.elasticity,
                "low": f.elasticity_low,
                "high": f.elasticity_high,
                "method": f.method,
            }
            for k, f in loop.fits.items()
        },
        "elasticity_error_over_time": errors,
        "seconds": round(seconds, 2),
    }


def run_grid(
    points: tuple[TruthPoint, ...], settings: GridSettings = GridSettings(), ablation: bool = True
) -> dict[str, Any]:
    """Every point, and the targets over them; with `ablation`, also the loop on the claims
    alone (no fit, no experiment) at each point: what learning the response is worth."""
    rows = [run_point(p, settings) for p in points]
    if ablation:
        for row, point in zip(rows, points):
            claims = run_point(point, replace(settings, learn=False))
            row["claims_only_regret_share"] = claims["regret_share"]
            row["claims_only_vs_static"] = claims["loop_vs_static"]
    regrets = [r["regret_share"] for r in rows]
    summary = {
        "points": len(rows),
        "days": settings.days,
        "history_days": settings.history_days,
        "regret_median": median(regrets),
        "regret_worst": max(regrets),
        "experiment_cost_share_worst": max(r["experiment_cost_share"] for r in rows),
        "revenue_ge_static_everywhere": all(r["revenue_ge_static"] for r in rows),
        "promise_breaches": sum(r["promise_breaches"] for r in rows),
    }
    if ablation:
        claims = [r["claims_only_regret_share"] for r in rows]
        summary["claims_only_regret_median"], summary["claims_only_regret_worst"] = (
            median(claims),
            max(claims),
        )
    summary["targets"] = grid_targets(summary)
    return {"summary": summary, "points": rows}


def grid_targets(summary: dict[str, Any]) -> dict[str, bool]:
    """The issue's targets over a grid's summary (this grid's and the job-level simulator's)."""
    return {
        "regret_median_le_3pct": summary["regret_median"] <= 0.03,
        "regret_worst_le_8pct": summary["regret_worst"] <= 0.08,
        "experiment_cost_le_1pct_of_revenue": summary["experiment_cost_share_worst"] <= 0.01,
        "revenue_ge_static_at_every_point": summary["revenue_ge_static_everywhere"],
        "rigid_promise_holds": summary["promise_breaches"] == 0,
    }
