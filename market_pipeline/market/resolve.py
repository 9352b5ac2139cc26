"""The live loop's periodic cold re-solve, and the walk to a better optimum.

Warm ticks start from the prices in force and keep whatever local optimum they are in; with
binding budgets there can be a better one elsewhere (``global_phase``). The loop therefore
re-solves cold on a schedule and, when that finds more profit, walks the prices there within
the per-tick step.

Call contract (the loop owns the schedule and keeps ``target`` between ticks)::

    # every tick, as today
    tick = solve_equilibrium(problem, last_prices=in_force, max_step=step, settings=s)

    # on the re-solve schedule (hourly, say): a cold solve with the global phase, which also
    # starts from the prices in force, so it is never worse than their local optimum
    fresh = global_resolve(problem, settings=s, current_prices=in_force)
    if fresh.status == "converged" and tick.status == "converged" and worth_switching(
            relative_gain(fresh.profit, tick.profit), threshold):
        target = fresh.prices            # held until reached, replaced or dropped

    # while a target is held, publish this instead of tick.prices
    prices = step_toward(target, in_force, max_step=step, price_min=res.price_min,
                         price_max=res.price_max, band_pairs=res.band_pairs)
    # once prices == target, drop the target: warm ticks continue from the better optimum

``step_toward`` keeps every promise: no price moves more than ``max_step`` (relative to the
price in force), prices stay inside [price_min, price_max], and drainable prices stay inside
their band around the guaranteed price of their pool (the prices in force and the target
both satisfy the band, so every point on the segment between them does; a pool's prices
move by one shared fraction of the way). All three functions are pure apart from the solve.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from market_pipeline.market.errors import InstanceError
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import SolveReport, SolverSettings
from market_pipeline.market.resources import BandPair

SWITCH_THRESHOLD = 1e-3  # a suggested default: switch for at least 0.1% more profit


def global_resolve(
    problem: MarketProblem,
    settings: SolverSettings | None = None,
    *,
    current_prices: np.ndarray | None = None,
    device: str = "cpu",
) -> SolveReport:
    """A cold solve with the global phase on (whatever ``settings.global_phase`` says), free
    of the per-tick step; ``current_prices`` (resource order), when given, is one more start,
    so the result is at least as profitable as the local optimum around them."""
    from market_pipeline.market.solve import solve_equilibrium

    settings = dataclasses.replace(settings or SolverSettings(), global_phase=True)
    starts = () if current_prices is None else (_checked(problem, current_prices, "current_prices"),)
    return solve_equilibrium(problem, settings=settings, device=device, extra_starts=starts)


def relative_gain(new_profit: float, current_profit: float) -> float:
    """(new - current) / |current|; +inf when only the new profit is a positive number."""
    if not math.isfinite(new_profit):
        return -math.inf
    if not math.isfinite(current_profit) or current_profit == 0:
        return math.inf if new_profit > 0 else 0.0
    return (new_profit - current_profit) / abs(current_profit)


def worth_switching(gain: float, threshold: float = SWITCH_THRESHOLD) -> bool:
    """Whether a relative profit gain justifies walking to the other optimum."""
    if not (math.isfinite(threshold) and threshold >= 0):
        raise InstanceError(f"switch threshold: must be finite and >= 0, got {threshold!r}")
    return not math.isnan(gain) and gain > threshold


def step_toward(
    target: np.ndarray,
    current: np.ndarray,
    *,
    max_step: float | np.ndarray,
    price_min: np.ndarray,
    price_max: np.ndarray,
    band_pairs: Sequence[BandPair] = (),
) -> np.ndarray:
    """One tick's prices on the way from ``current`` (in force) to ``target``: each pool's
    prices move by the largest shared fraction of the way that keeps every move within
    ``max_step`` x current. Returns ``target`` itself once it is within one step."""
    target, current = (np.asarray(v, dtype=np.float64) for v in (target, current))
    low, high = (np.asarray(v, dtype=np.float64) for v in (price_min, price_max))
    m = current.shape[0]
    step = np.broadcast_to(np.asarray(max_step, dtype=np.float64), (m,))
    for name, value in (("target", target), ("current", current), ("price_min", low), ("price_max", high)):
        if value.shape != (m,) or not np.all(np.isfinite(value)) or np.any(value <= 0):
            raise InstanceError(f"step_toward: {name} must be {m} finite prices > 0, got {value!r}")
    if not np.all(np.isfinite(step)) or np.any(step < 0) or np.any(high < low):
        raise InstanceError("step_toward: max_step must be finite and >= 0, price_max >= price_min")
    goal = np.clip(target, low, high)
    delta = goal - current
    allowed = step * current
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(np.abs(delta) > allowed, allowed / np.abs(delta), 1.0)
    for group in _pool_groups(m, band_pairs):
        fraction[group] = fraction[group].min()
    prices = np.clip(current + fraction * delta, low, high)
    prices = _into_bands(prices, current, step, low, high, band_pairs)
    return np.where(fraction >= 1.0, goal, prices)


def _pool_groups(m: int, band_pairs: Sequence[BandPair]) -> list[np.ndarray]:
    """Resources linked by band pairs (a guaranteed price and its drainable ones)."""
    root = list(range(m))

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i

    for pair in band_pairs:
        root[find(pair.drainable)] = find(pair.guaranteed)
    groups: dict[int, list[int]] = {}
    for i in range(m):
        groups.setdefault(find(i), []).append(i)
    return [np.array(g) for g in groups.values() if len(g) > 1]


def _into_bands(prices, current, step, low, high, band_pairs: Sequence[BandPair]) -> np.ndarray:
    """Only needed when the prices in force break a band (it was tightened): the drainable
    price moves into its band as far as its own step and bounds allow."""
    out = prices.copy()
    for pair in band_pairs:
        g, d = pair.guaranteed, pair.drainable
        band_low, band_high = (1 - pair.discount_max) * out[g], (1 - pair.discount_min) * out[g]
        if band_low <= out[d] <= band_high:
            continue
        reach_low = max(current[d] * (1 - step[d]), low[d])
        reach_high = min(current[d] * (1 + step[d]), high[d])
        out[d] = float(np.clip(np.clip(out[d], band_low, band_high), reach_low, reach_high))
    return out


def _checked(problem: MarketProblem, prices: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(prices, dtype=np.float64).reshape(-1)
    if values.shape != (problem.resources.size,) or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise InstanceError(f"{name}: expected {problem.resources.size} finite prices > 0, got {prices!r}")
    return values
