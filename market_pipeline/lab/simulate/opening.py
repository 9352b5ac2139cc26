"""Where a strategy run starts: the steady state of the strategy's own opening prices.

openb's jobs are long (GPU-hour-weighted runtime: Burstable 11.6 days, LS 77 days), so the
GPUs held at any instant reflect the prices of the past weeks, not of the hour. Every run
starts from a snapshot of running jobs (`arrivals.initial_population`); drawing it at the
list price for every strategy would measure a repricing strategy mostly while its stock of
jobs relaxes from static's steady state towards its own (days to weeks), i.e. the transition,
not the strategy. So each run draws its snapshot at the demand of its own opening prices:

1. the strategy posts prices for a view of the list-price steady state (the list-price
   snapshot placed as static pricing's run places it: the GPUs its jobs hold per pool and
   class, and those of the jobs it leaves waiting, where a pool is overloaded), repeated
   until its prices settle (its per-tick step limit applies to each round). Before round
   thirteen of #46 the view held the whole snapshot and nothing waiting: a pool overloaded by
   guaranteed work looked served, and its guaranteed price opened with a premium its
   guarantee could not back (`tick.promises.guarantee_reach`);
2. the snapshot is drawn at the tenants' best response to those prices, at the history's
   mean load index, from per-(tenant, pool) generators, so that a cell whose demand is
   unchanged draws the same jobs in every run.

Static and utilisation-based pricing open at the list price (their snapshot is the list-
price steady state); the rule is the same for all strategies. The unmeasured warm-up
(`SimulationSettings.warmup_days`) then runs on the trace before the window.
"""

from __future__ import annotations

import numpy as np

from market_pipeline.lab.simulate.arrivals import InitialJobs, initial_population
from market_pipeline.lab.simulate.pricing import MarketView, PricingStrategy
from market_pipeline.lab.simulate.tenants import TenantModel, best_response

OPENING_ROUNDS = 12  # step-limited rounds (25% per round reaches any price in the band)
SETTLED = 1e-3  # relative price change that ends the rounds


def opening_prices(
    strategy: PricingStrategy,
    capacity: np.ndarray,
    held: np.ndarray,
    history: np.ndarray,
    list_prices: np.ndarray,
    waiting: np.ndarray | None = None,
) -> np.ndarray:
    """The strategy's settled prices for the list-price steady state: `held` (R, 2) GPUs
    running, `waiting` (R, 2) GPUs left waiting (None: nothing)."""
    prices = list_prices.copy()
    pending = np.zeros_like(held) if waiting is None else waiting
    for _ in range(OPENING_ROUNDS):
        view = MarketView(0, 0.0, capacity, held, pending, history, prices.copy())
        posted = np.asarray(strategy.decide(view).prices, dtype=np.float64)
        moved = float(np.max(np.abs(posted - prices) / np.maximum(prices, 1e-12)))
        prices = posted
        if moved < SETTLED:
            break
    return prices


def opening_jobs(
    model: TenantModel,
    pods,
    prices: np.ndarray,
    index: float,
    seed: int,
    list_jobs: InitialJobs,
    list_prices: np.ndarray,
) -> InitialJobs:
    """The snapshot at `prices`: the shared list-price snapshot when the prices are the list
    prices (static, utilisation), else drawn at the best response to them."""
    if np.allclose(prices, list_prices, rtol=1e-12, atol=0.0):
        return list_jobs
    return initial_population(model, pods, best_response(model, prices) * index, seed)
