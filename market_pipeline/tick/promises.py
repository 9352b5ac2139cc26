"""The promises every published price keeps, live and simulated (config `[market]`):

- the max step: a price moves at most `max_price_step` (a share) from the price in force per
  tick, the first solve included (the price in force is then the base price);
- the guaranteed cap: the guaranteed price never exceeds `guaranteed_price_cap` times the
  pool's list price (the promise to rigid tenants); with `guardrails.rigid_guarantee.
  premium_follows_reach`, of that premium over list a pool charges only the share its
  guarantee can back this tick (`guarantee_reach`): none where guaranteed work waits and no
  drainable work in the pool could be drained for it;
- the drainable band: the drainable price sits `drainable_discount_min..max` below the
  guaranteed price of the same pool and tick;
- the pool's price bounds (`price_min`, `price_max`).

Where promises conflict (a price in force outside a cap lowered since), the bounds, the cap
and the band win over the step: they are what a tenant can read off the price list, the step
is how fast the loop gets there. Every clip is reported.

This is the promises' one home: the live tick, the simulator, the scaling replay, quotes and
the checks on the price book all read a `Promises` built by `Promises.from_config` and ask it
for the ceiling, the band, the step's reach and the breaches; none re-derives them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

_TOL = 1e-9


@dataclass(frozen=True)
class Promises:
    max_step: float = 0.25
    guaranteed_cap: float = 1.04
    discount_min: float = 0.2
    discount_max: float = 0.6
    # the guaranteed premium follows what the pool's guarantee can back (`guarantee_reach`;
    # config `guardrails.rigid_guarantee.premium_follows_reach`); off: the cap alone
    premium_follows_reach: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_step) and self.max_step > 0):
            raise ValueError(f"max_step: must be finite and > 0, got {self.max_step!r}")
        if not (math.isfinite(self.guaranteed_cap) and self.guaranteed_cap >= 1):
            raise ValueError(f"guaranteed_cap: must be finite and >= 1, got {self.guaranteed_cap!r}")
        if not 0 <= self.discount_min <= self.discount_max < 1:
            raise ValueError("drainable band: need 0 <= discount_min <= discount_max < 1")

    @classmethod
    def from_config(cls, config: MarketPipelineConfig, *, guaranteed_cap: float | None = None) -> "Promises":
        """The config's `[market]` promises; `guaranteed_cap` replaces the configured cap where
        a caller prices under another one (a simulated what-if, the replay's single price)."""
        market = config.market
        return cls(
            max_step=market.max_price_step,
            guaranteed_cap=market.guaranteed_price_cap if guaranteed_cap is None else guaranteed_cap,
            discount_min=market.drainable_discount_min,
            discount_max=market.drainable_discount_max,
            premium_follows_reach=config.guardrails.rigid_guarantee.premium_follows_reach,
        )

    def guaranteed_ceiling(self, list_price: float, price_max: float, reach: float = 1.0) -> float:
        """The highest guaranteed price a pool may publish: its cap over list, or `price_max`;
        with `reach` below 1 (`guarantee_reach`) and `premium_follows_reach`, only that share of
        the cap's premium over list (a pool with no premium to back asks list, or `price_max`
        where that is lower)."""
        capped = min(price_max, self.guaranteed_cap * list_price)
        if reach >= 1.0 or not self.premium_follows_reach:
            return capped
        return min(capped, list_price + reach * max(capped - list_price, 0.0))

    def drainable_ceiling(self, list_price: float, price_max: float, reach: float = 1.0) -> float:
        """The highest drainable price: the narrowest discount below the guaranteed ceiling."""
        return self.guaranteed_ceiling(list_price, price_max, reach) * (1 - self.discount_min)

    def drainable_floor(self, price_min: float) -> float:
        """The lowest drainable price: the widest discount below the pool's `price_min`."""
        return price_min * (1 - self.discount_max)

    def band(self, guaranteed: float) -> tuple[float, float]:
        """The drainable band below a guaranteed price: (lowest, highest) drainable price."""
        return guaranteed * (1 - self.discount_max), guaranteed * (1 - self.discount_min)

    def band_mid(self) -> float:
        """The band's middle discount (where a drainable price starts without a history)."""
        return 0.5 * (self.discount_min + self.discount_max)

    def step_range(self, in_force: float) -> tuple[float, float]:
        """The prices one step from `in_force` reaches, before any other promise."""
        return in_force * (1 - self.max_step), in_force * (1 + self.max_step)

    def reach(self, ticks: float) -> tuple[float, float]:
        """The factors a price can move by, down and up, in `ticks` steps."""
        return (1 - self.max_step) ** ticks, (1 + self.max_step) ** ticks

    def over_cap(self, guaranteed: np.ndarray, list_price: np.ndarray) -> np.ndarray:
        """Where guaranteed prices break the cap over their list price (the book's tolerance)."""
        return guaranteed > self.guaranteed_cap * list_price * (1 + _TOL)

    def over_step(self, new: np.ndarray, old: np.ndarray) -> np.ndarray:
        """Where a price moved more than the max step from the one before it."""
        return np.abs(new - old) > self.max_step * old * (1 + _TOL) + 1e-12


@dataclass(frozen=True)
class PriceWindow:
    """The prices a resource may publish this tick, and what set each end."""

    low: float
    high: float
    low_by: str
    high_by: str

    def clip(self, price: float) -> tuple[float, str | None]:
        if price > self.high * (1 + _TOL):
            return self.high, f"{price:.4g} above the {self.high_by} {self.high:.4g}"
        if price < self.low * (1 - _TOL):
            return self.low, f"{price:.4g} below the {self.low_by} {self.low:.4g}"
        return price, None


def guarantee_reach(drainable_running_gpus: float, guaranteed_waiting_gpus: float) -> float:
    """The share of the guaranteed premium a pool's guarantee backs now, in [0, 1].

    Rigid tenants pay the premium for assured access: drainable work is drained to make room
    for them. With no guaranteed work waiting the promise holds (reach 1). While guaranteed
    work waits, drains can serve at most the GPUs drainable work holds in the pool, so the
    premium backs that share of the waiting GPUs: a pool overloaded by guaranteed work alone
    (nothing to drain) charges list, and its tenants pay nothing for a promise nobody can keep
    (the guarantee wins over the premium's revenue, #46)."""
    if not (guaranteed_waiting_gpus > 0):
        return 1.0
    return float(min(1.0, max(drainable_running_gpus, 0.0) / guaranteed_waiting_gpus))


def guaranteed_window(
    in_force: float,
    list_price: float,
    price_min: float,
    price_max: float,
    promises: Promises,
    reach: float = 1.0,
) -> PriceWindow:
    """The guaranteed price's window: step from the price in force, the cap (the share
    `reach` of its premium) and the bounds."""
    ceiling = promises.guaranteed_ceiling(list_price, price_max, reach)
    if reach < 1.0 and ceiling < promises.guaranteed_ceiling(list_price, price_max) * (1 - _TOL):
        ceiling_by = "guarantee reach"
    elif promises.guaranteed_cap * list_price < price_max:
        ceiling_by = "guaranteed cap"
    else:
        ceiling_by = "price_max"
    return _window(in_force, promises, price_min, "price_min", ceiling, ceiling_by)


def drainable_window(in_force: float, guaranteed: float, floor: float, promises: Promises) -> PriceWindow:
    """The drainable price's window: the band below this tick's guaranteed price, the step."""
    band_low, band_high = promises.band(guaranteed)
    return _window(in_force, promises, max(floor, band_low), "drainable band", band_high, "drainable band")


def _window(
    in_force: float, promises: Promises, low: float, low_by: str, high: float, high_by: str
) -> PriceWindow:
    down, up = promises.step_range(in_force)
    lo, lo_by = (down, "max step") if down > low else (low, low_by)
    hi, hi_by = (up, "max step") if up < high else (high, high_by)
    if down > high:  # the step cannot come down into the fixed window: its top wins
        return PriceWindow(high, high, high_by, high_by)
    if up < low:  # ...nor up into it: its bottom wins
        return PriceWindow(low, low, low_by, low_by)
    return PriceWindow(lo, hi, lo_by, hi_by)
