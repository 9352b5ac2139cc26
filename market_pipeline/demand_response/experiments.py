"""Bounded price experiments: the randomised dither that identifies the demand response.

Each tick, every pool x class with a running experiment publishes its price moved by
+-`amplitude` (5% by default), the sign drawn per pool, class and tick from a seeded hash
(randomised across pools and hours, reproducible, independent of the load, so the estimator's
controls leave it as the price's only free variation). The moved price is clipped into the
tick's own promise window (the max step from the price in force, the guaranteed cap, the
pool's bounds; the drainable band below this tick's guaranteed price), and never below a price
the backlog shield raised: the promises and the guardrail hold on every experiment price.

An experiment stops when the data's own 80% interval (the prior left out) is narrow enough:
width <= max(`stop_relative_width` x |e|, `stop_absolute_width`), or narrow enough to decide
the price: where every elasticity in the interval puts the profit-maximising price (Lerner:
c e / (e - 1), unbounded for e <= 1) at or above the class's ceiling (the guaranteed cap, the
band's top), the price sits at the ceiling whatever the truth in the interval, and a dither
that can only go down there costs revenue for nothing (the rigid class at its cap). The
decision test reads the data's interval and also the posterior's (the claims as the prior):
where the claims and the data together already put the price at the ceiling, a one-sided
dither there only gives up revenue to confirm it. Its cost is the profit the
dither gives up by the loop's own model (`model_profit` at the experiment's prices against
the tick's). In shadow mode the experiment prices are recorded, not published.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from market_pipeline.demand_response.estimator import ResponseFit
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick.live import EXPERIMENT_REASON
from market_pipeline.tick.market_tick import MarketTick, PoolTickInput
from market_pipeline.tick.promises import Promises, drainable_window, guaranteed_window
from market_pipeline.tick.response import response_key


class ExperimentSettingsError(ValueError):
    """An experiment setting is out of range; the message names it."""


@dataclass(frozen=True)
class ExperimentSettings:
    amplitude: float = 0.05
    stop_relative_width: float = 0.3
    stop_absolute_width: float = 0.2
    level: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.amplitude) and 0 < self.amplitude <= 0.25):
            raise ExperimentSettingsError(f"amplitude must be in (0, 0.25], got {self.amplitude!r}")
        for name in ("stop_relative_width", "stop_absolute_width"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ExperimentSettingsError(f"{name} must be finite and > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ExperimentStep:
    """One resource's experiment price at one tick."""

    key: str
    sign: int
    base_price: float
    price: float
    clipped_by: str  # "" or what bounded the move (a promise, the shield)


def dither_sign(seed: int, key: str, slot: int) -> int:
    """+1 or -1, a seeded hash of (pool x class, tick): random across pools and hours (a
    cryptographic hash: a CRC's low bit is linear in its input, so keys' signs would move together)."""
    return 1 if hashlib.blake2b(f"{seed}|{key}|{slot}".encode(), digest_size=1).digest()[0] & 1 else -1


def interval_narrow(
    fit: ResponseFit | None,
    settings: ExperimentSettings,
    unit_cost: float | None = None,
    ceiling: float | None = None,
) -> bool:
    """Whether the data alone (no prior) pin the elasticity down well enough to stop: narrow
    enough, or (given the resource's unit cost and price ceiling) enough to decide its price."""
    if fit is None or fit.data_std_error is None or fit.data_elasticity is None:
        return False
    z = float(stats.norm.ppf(0.5 + settings.level / 2))
    half = z * fit.data_std_error
    if 2 * half <= max(settings.stop_relative_width * abs(fit.data_elasticity), settings.stop_absolute_width):
        return True
    if unit_cost is None or ceiling is None:
        return False
    highs = [fit.data_elasticity + half]
    if fit.elasticity_high is not None:
        highs.append(fit.elasticity_high)  # the posterior's
    return any(high <= 1 or unit_cost * high / (high - 1) >= ceiling for high in highs)


def perturb_tick(
    tick: MarketTick,
    pools: Sequence[PoolTickInput],
    promises: Promises,
    running: Collection[str],
    settings: ExperimentSettings,
    slot: int,
) -> tuple[MarketTick, list[ExperimentStep]]:
    """The tick with each running experiment's price moved inside its promise window, and the
    experiment steps (the tick's own price beside the experiment's)."""
    records, steps = [], []
    for p, r in zip(pools, tick.pools):
        g_key, d_key = response_key(p.pool_id, GUARANTEED), response_key(p.pool_id, DRAINABLE)
        if g_key not in running and d_key not in running:
            records.append(r)
            continue
        window = guaranteed_window(
            p.in_force_guaranteed, p.list_price, p.price_min, p.price_max, promises, p.guarantee_reach
        )
        low, low_by = window.low, window.low_by
        if r.shielded or not r.certified:  # the shield's price is the floor of any experiment
            low, low_by = max(low, r.guaranteed), "backlog shield"
        guaranteed, reasons = r.guaranteed, []
        if g_key in running:
            sign = dither_sign(settings.seed, g_key, slot)
            guaranteed, by = _moved(
                r.guaranteed, sign, settings.amplitude, low, low_by, window.high, window.high_by
            )
            steps.append(ExperimentStep(g_key, sign, r.guaranteed, guaranteed, by))
            reasons.append(f"{EXPERIMENT_REASON} {guaranteed / r.guaranteed - 1:+.1%}")
        d_window = drainable_window(
            p.in_force_drainable, guaranteed, promises.drainable_floor(p.price_min), promises
        )
        drainable, clipped = d_window.clip(r.drainable)
        # the band follows this tick's guaranteed price: an experiment there may move it
        d_reasons = [f"follows the guaranteed {EXPERIMENT_REASON}: price {clipped}"] if clipped else []
        if d_key in running:
            sign = dither_sign(settings.seed, d_key, slot)
            drainable, by = _moved(
                r.drainable,
                sign,
                settings.amplitude,
                d_window.low,
                d_window.low_by,
                d_window.high,
                d_window.high_by,
            )
            steps.append(ExperimentStep(d_key, sign, r.drainable, drainable, by))
            d_reasons.append(f"{EXPERIMENT_REASON} {drainable / r.drainable - 1:+.1%}")
        records.append(
            replace(
                r,
                guaranteed=guaranteed,
                drainable=drainable,
                guaranteed_reason="; ".join([r.guaranteed_reason, *reasons])
                if reasons
                else r.guaranteed_reason,
                drainable_reason="; ".join([r.drainable_reason, *d_reasons])
                if d_reasons
                else r.drainable_reason,
            )
        )
    return replace(tick, pools=tuple(records)), steps


def _moved(
    base: float, sign: int, amplitude: float, low: float, low_by: str, high: float, high_by: str
) -> tuple[float, str]:
    target = base * (1 + sign * amplitude)
    if target > high:
        return max(high, min(base, high)), high_by
    if target < low:
        return min(low, max(base, low)), low_by
    return target, ""


def dither_cost(
    problem,
    list_prices: np.ndarray,
    promises: Promises,
    response: dict[str, float],
    tick_prices: np.ndarray,
    moved_prices: np.ndarray,
    level_prices: np.ndarray | None = None,
    observed: dict[str, tuple[float, float]] | None = None,
) -> float:
    """The profit per hour the loop's own model (the tenants calibrated to `response` at the
    reference prices, or at `level_prices` as `run_market_tick`'s) says the experiment prices give up against the tick's: the cost the
    live loop records with each experiment row and the simulator reports."""
    from market_pipeline.tick.response import calibrated_to_response, level_anchor

    mid = promises.band_mid()
    anchor = level_anchor(list_prices, problem.resources.resource_class, mid, level_prices)
    calibrated = calibrated_to_response(problem, anchor, response, observed)
    return model_profit(calibrated, tick_prices) - model_profit(calibrated, moved_prices)


def model_profit(problem, prices: np.ndarray) -> float:
    """Profit per hour the model expects at `prices`: sum (p - c) min(D, C)."""
    from market_pipeline.market.solve import demand_at

    res = problem.resources
    sold = np.minimum(np.maximum(np.nan_to_num(demand_at(problem, prices)), 0.0), res.capacity)
    return float(((np.asarray(prices) - res.unit_cost) * sold).sum())
