"""Pricing strategies the simulator compares. Each one sees the same `MarketView` at the start
of a tick and posts one price per resource (pool x class) for the tick.

- `static`: the list price, for both classes, always; no drains.
- `premium` (a yardstick, `bench guarantee --premium-only`): static pricing with the
  guaranteed class at its capped price (`guaranteed_max`, the cap over list the market's
  guaranteed price sits at) and nothing else: the drainable class at list, no drains. What the
  premium alone does to rigid work, beside what the market's drainable prices and drains do.
- `utilization` (the common surge rule the market is measured against): when a pool's demand (running + pending GPUs) passes 85% of
  its capacity the price rises exponentially (doubling 15 points above the threshold),
  capped by the guaranteed price cap; one price for both classes; no drains.
- `stackelberg` (`simulate.stackelberg`): the shared equilibrium engine prices both classes
  per pool every tick, the backlog-drainability shield corrects it, and drainable jobs may
  be drained (task-drain guardrail) when rigid demand needs their capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from market_pipeline.lab.simulate.settings import EconomicAssumptions
from market_pipeline.lab.simulate.tenants import Pool, list_price_vector

RIGID, ELASTIC = 0, 1


@dataclass(frozen=True)
class MarketView:
    """What a strategy knows at the start of a tick (arrays per pool, class columns
    RIGID/ELASTIC in GPUs)."""

    tick: int
    time_s: float
    capacity: np.ndarray  # (R,)
    allocated: np.ndarray  # (R, 2)
    pending: np.ndarray  # (R, 2)
    index_history: np.ndarray  # observed load index per past tick (oldest first)
    last_prices: np.ndarray  # (2R,) resource order
    # (2R,) GPUs requested by the jobs submitted over the last tick (None before the first):
    # the demand the last prices met, what a learning strategy observes
    bought: np.ndarray | None = None

    @property
    def demand(self) -> np.ndarray:
        """(R,) running + pending GPUs per pool (at least 0: fractional GPUs added and taken
        off again leave float drift, e.g. -2e-16 on an emptied pool)."""
        return np.maximum(self.allocated.sum(axis=1) + self.pending.sum(axis=1), 0.0)


@dataclass(frozen=True)
class PriceDecision:
    prices: np.ndarray  # (2R,) resource order
    info: dict[str, Any] = field(default_factory=dict)


class PricingStrategy(Protocol):
    name: str
    drains: bool  # drainable jobs may be drained for rigid demand

    def decide(self, view: MarketView) -> PriceDecision: ...


class StaticPricing:
    name = "static"
    drains = False

    def __init__(self, pools: tuple[Pool, ...]) -> None:
        self._prices = list_price_vector(pools)

    def decide(self, view: MarketView) -> PriceDecision:
        return PriceDecision(self._prices.copy())


class PremiumPricing:
    """Static pricing plus the guaranteed premium, nothing else (the module's `premium`).

    On `gpuspec33/vcpDC/s101` and `gpuspec33/vc6YE/s227` of #46 it breaks the per-tick rigid
    promise on the same ticks as the learning market, with the same weekly counts: the `V100`
    pools there are full of rigid work that may run nowhere else, the premium thins their
    arrivals (common random numbers), and which jobs then start first moves the late counts
    either way."""

    name = "premium"
    drains = False

    def __init__(self, pools: tuple[Pool, ...]) -> None:
        self._prices = list_price_vector(pools)
        self._prices[0::2] = [p.prices.guaranteed_max for p in pools]

    def decide(self, view: MarketView) -> PriceDecision:
        return PriceDecision(self._prices.copy())


class UtilizationPricing:
    name = "utilization"
    drains = False

    def __init__(self, pools: tuple[Pool, ...], economics: EconomicAssumptions) -> None:
        self.list_price = np.array([p.prices.list_price for p in pools])
        self.low = np.array([p.prices.price_min for p in pools])
        self.high = np.array([p.prices.guaranteed_max for p in pools])
        self.threshold = economics.utilization_threshold
        self.slope = math.log(2.0) / economics.utilization_doubling

    def decide(self, view: MarketView) -> PriceDecision:
        utilisation = view.demand / np.maximum(view.capacity, 1e-9)
        premium = np.exp(self.slope * np.maximum(utilisation - self.threshold, 0.0))
        price = np.clip(self.list_price * premium, self.low, self.high)
        return PriceDecision(np.repeat(price, 2), {"max_demand_ratio": float(utilisation.max())})
