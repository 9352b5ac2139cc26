"""Turning a raw (possibly gappy) demand history into a fit-ready series, or a fallback reason.

Short gaps are carried forward; a gap longer than `max_gap_steps` cuts the history, so the
models only see the contiguous stretch since the last outage. Zero demand before a pool's
first demand is not history either (see `_first_demand`). A pool whose usable stretch is
short, constant or stale gets a fallback forecast with the reason recorded instead of a fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market_pipeline.forecast.settings import ForecastInputError, ForecastSettings

# z of the normal 0.9 quantile: fallback half-widths from a mean absolute change.
Z_90 = 1.2816


@dataclass(frozen=True)
class PreparedHistory:
    values: np.ndarray  # gap-free, ends at the forecast origin (may be empty)
    price: np.ndarray | None
    last_observed: float | None
    mean_abs_step: float  # of the usable stretch; 0 when constant or too short
    reason: str | None  # a fallback is needed when set


def as_history_array(history: object, name: str = "history") -> np.ndarray:
    values = np.asarray(history, dtype=float)
    if values.ndim != 1:
        raise ForecastInputError(f"{name} must be one-dimensional, got shape {values.shape}")
    if np.isinf(values).any():
        raise ForecastInputError(
            f"{name} contains infinite values at index {int(np.flatnonzero(np.isinf(values))[0])}"
        )
    negative = np.flatnonzero(values < 0)
    if negative.size:
        raise ForecastInputError(
            f"{name} contains negative values (first at index {int(negative[0])}: {values[negative[0]]})"
        )
    return values


def prepare_history(history: object, price: object | None, settings: ForecastSettings) -> PreparedHistory:
    values = as_history_array(history)
    prices = None if price is None else as_history_array(price, "price")
    if prices is not None and prices.shape != values.shape:
        raise ForecastInputError(f"price has {prices.size} points but history has {values.size}")
    if values.size > settings.max_history_points:
        values = values[-settings.max_history_points :]
        prices = None if prices is None else prices[-settings.max_history_points :]
    observed = np.flatnonzero(np.isfinite(values))
    if observed.size == 0:
        return PreparedHistory(np.empty(0), None, None, 0.0, "no observed demand in history")
    last = int(observed[-1])
    stale = values.size - 1 - last
    if stale > settings.max_stale_steps:
        return PreparedHistory(
            np.empty(0),
            None,
            float(values[last]),
            0.0,
            f"stale history: newest observation is {stale} steps old (limit {settings.max_stale_steps})",
        )
    start, cut_gap = _stretch_start(values, observed, settings.max_gap_steps)
    start = max(start, _first_demand(values))
    stretch = _carry_forward(values[start:])
    stretch_price = None if prices is None else _fill_price(prices[start:])
    mean_step = float(np.mean(np.abs(np.diff(stretch)))) if stretch.size > 1 else 0.0
    reason = _fallback_reason(stretch, cut_gap, mean_step, settings)
    return PreparedHistory(stretch, stretch_price, float(values[last]), mean_step, reason)


def _stretch_start(values: np.ndarray, observed: np.ndarray, max_gap: int) -> tuple[int, int]:
    """Start of the stretch after the last gap longer than `max_gap`, and that gap's length."""
    missing_runs = np.diff(observed) - 1
    long_runs = np.flatnonzero(missing_runs > max_gap)
    if long_runs.size == 0:
        return int(observed[0]), 0
    run = int(long_runs[-1])
    return int(observed[run + 1]), int(missing_runs[run])


def _first_demand(values: np.ndarray) -> int:
    """Index of the first non-zero demand (0 when there is none).

    A demand grid is zero-filled back to its window's start, so a pool created (or a fleet
    started) inside the window shows days of exact zeros first. Those are not a quiet pool:
    every interval covers them, so they set the calibration and fill the rolling coverage
    with ties (the demo's check read 0.94-1.0 at 4 h off the zeros before its first hour).
    The step from 0 to the first demand is dropped too: it is the pool starting, and one
    such jump would set the volatility floor of a short history. A pool that has never had
    demand keeps its whole (constant) history and falls back as before.
    """
    demand = np.flatnonzero(np.nan_to_num(values) > 0.0)
    return int(demand[0]) if demand.size else 0


def _carry_forward(values: np.ndarray) -> np.ndarray:
    """Forward-fill NaN; the first element is observed by construction."""
    index = np.where(np.isfinite(values), np.arange(values.size), 0)
    np.maximum.accumulate(index, out=index)
    return values[index]


def _fill_price(price: np.ndarray) -> np.ndarray | None:
    known = np.flatnonzero(np.isfinite(price))
    if known.size == 0:
        return None
    head = price.copy()
    head[: known[0]] = price[known[0]]  # before the first quote, assume the first quote
    return _carry_forward(head)


def _fallback_reason(
    stretch: np.ndarray, cut_gap: int, mean_step: float, settings: ForecastSettings
) -> str | None:
    if stretch.size < settings.min_history_points:
        since = f" since a {cut_gap}-step gap" if cut_gap else ""
        return f"short history: {stretch.size} usable points{since} (need {settings.min_history_points})"
    if mean_step == 0.0:
        return f"constant history at {stretch[-1]:g} over {stretch.size} points"
    return None


def fallback_level(
    prepared: PreparedHistory, prior: float | None, settings: ForecastSettings
) -> tuple[float, str]:
    """Level of a fallback forecast and the name of what produced it."""
    stale = prepared.reason is not None and prepared.reason.startswith("stale")
    if prepared.last_observed is None or (stale and prior is not None):
        return (settings.default_prior if prior is None else float(prior)), "prior"
    if prepared.values.size:
        return float(prepared.values[-1]), "persistence"
    return prepared.last_observed, "persistence"


def fallback_band(
    level: float, horizons: np.ndarray, steps_per_hour: int, mean_abs_step: float, settings: ForecastSettings
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat median with a random-walk-like band: observed volatility, or a share of the level."""
    growth = np.sqrt(horizons / steps_per_hour)
    observed = Z_90 * mean_abs_step * np.sqrt(horizons)
    relative = settings.fallback_relative_spread * max(abs(level), 1.0) * growth
    half_width = np.maximum(observed, relative)
    median = np.full(horizons.shape, level, dtype=float)
    low = median - half_width
    if settings.clip_at_zero:
        low = np.maximum(low, 0.0)
    return low, median, median + half_width
