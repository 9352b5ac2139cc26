"""The promises every published price keeps, live and simulated (config `[market]`):

- the max step: a price moves at most `max_price_step` (a share) from the price in force per
  tick, the first solve included (the price in force is then the base price);
- the guaranteed cap: the guaranteed price never exceeds `guaranteed_price_cap` times the
  pool's list price (the promise to rigid tenants);
- the drainable band: the drainable price sits `drainable_discount_min..max` below the
  guaranteed price of the same pool and tick;
- the pool's price bounds (`price_min`, `price_max`).

Where promises conflict (a price in force outside a cap lowered since), the bounds, the cap
and the band win over the step: they are what a tenant can read off the price list, the step
is how fast the loop gets there. Every clip is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

_TOL = 1e-9


@dataclass(frozen=True)
class Promises:
    max_step: float = 0.25
    guaranteed_cap: float = 1.04
    discount_min: float = 0.2
    discount_max: float = 0.6

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_step) and self.max_step > 0):
            raise ValueError(f"max_step: must be finite and > 0, got {self.max_step!r}")
        if not (math.isfinite(self.guaranteed_cap) and self.guaranteed_cap >= 1):
            raise ValueError(f"guaranteed_cap: must be finite and >= 1, got {self.guaranteed_cap!r}")
        if not 0 <= self.discount_min <= self.discount_max < 1:
            raise ValueError("drainable band: need 0 <= discount_min <= discount_max < 1")

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "Promises":
        market = config.market
        return cls(
            max_step=market.max_price_step,
            guaranteed_cap=market.guaranteed_price_cap,
            discount_min=market.drainable_discount_min,
            discount_max=market.drainable_discount_max,
        )


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


def guaranteed_window(
    in_force: float, list_price: float, price_min: float, price_max: float, promises: Promises
) -> PriceWindow:
    """The guaranteed price's window: step from the price in force, the cap and the bounds."""
    ceiling, ceiling_by = (
        min(price_max, promises.guaranteed_cap * list_price),
        ("guaranteed cap" if promises.guaranteed_cap * list_price < price_max else "price_max"),
    )
    return _window(in_force, promises.max_step, price_min, "price_min", ceiling, ceiling_by)


def drainable_window(in_force: float, guaranteed: float, floor: float, promises: Promises) -> PriceWindow:
    """The drainable price's window: the band below this tick's guaranteed price, the step."""
    return _window(
        in_force,
        promises.max_step,
        max(floor, guaranteed * (1 - promises.discount_max)),
        "drainable band",
        guaranteed * (1 - promises.discount_min),
        "drainable band",
    )


def _window(in_force: float, step: float, low: float, low_by: str, high: float, high_by: str) -> PriceWindow:
    down, up = in_force * (1 - step), in_force * (1 + step)
    lo, lo_by = (down, "max step") if down > low else (low, low_by)
    hi, hi_by = (up, "max step") if up < high else (high, high_by)
    if down > high:  # the step cannot come down into the fixed window: its top wins
        return PriceWindow(high, high, high_by, high_by)
    if up < low:  # ...nor up into it: its bottom wins
        return PriceWindow(low, low, low_by, low_by)
    return PriceWindow(lo, hi, lo_by, hi_by)
