"""Online conformal intervals: quantile tracking per horizon, with delayed feedback.

Split conformal (conformal.py) fixes the interval's quantiles once; when a cluster's regime
shifts the coverage drifts with it. Here each horizon's lower and upper normalised quantiles
follow the observed misses (the "P" part of conformal PID control, Angelopoulos, Candes and
Tibshirani 2023):

    upper <- upper + rate_h * (1[r > upper] - (1 - UPPER_QUANTILE))
    lower <- lower - rate_h * (1[r < lower] - LOWER_QUANTILE)

where r is the volatility-normalised residual and rate_h = `rate` x the horizon's initial
(split-conformal) interval width, so one unitless rate serves every pool and horizon. The
long-run miss rate of each side converges to its level whatever the data do, which is what
makes the coverage hold through regime changes. A residual of origin t at horizon h is only
known at t + h, so the quantiles used at origin t have absorbed origins <= t - h only, and
each miss is judged against the interval issued at its origin (the delayed-feedback form).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market_pipeline.forecast.settings import LOWER_QUANTILE, UPPER_QUANTILE

# Each offset stays at least half this share of the initial width away from the point
# forecast, so a quiet spell cannot collapse an interval to a point; and since the issued
# interval always contains the point (Calibration.bounds), the offsets never cross it.
MIN_WIDTH_SHARE = 0.05
# Exponent of the step's slowdown with the feedback delay. Chosen on the first half of each
# Helios month (`--head-fraction 0.5`) with a 1-width bank: 0.5 (a 4 h step of rate/2) left
# 4 h coverage at 0.83-0.85 on two of four clusters, 0 (no slowdown) raised the 4 h pinball
# loss by up to 15%; 0.25 kept every 4 h cell within 0.78-0.83. See docs/history/forecast_tuning.md.
DELAY_SLOWDOWN = 0.25
# How far past its floor a side's state may wind (in reference widths); see track(). The
# bank is also a delay when a quiet pool turns busy (the banked misses are forgiven first):
# 1 width held lumpy clusters closest to 0.8 but left a 1 h interval at 15% coverage 4-8 h
# after a quiet week ended (synthetic); 0.5 keeps ~40% there (no bank: ~55%) and costs
# lumpy clusters ~0.01 of coverage (first half of each Helios month; docs/history/forecast_tuning.md).
WINDUP_WIDTHS = 0.5
# The least reference width, in normalised units (residual / recent mean |1-step change|;
# a random walk's 1-step 80% interval is ~3 wide): a pool calibrated while idle (every
# residual 0) would otherwise step a share of ~0 per miss and never widen once busy.
MIN_REFERENCE_WIDTH = 1.0
# Feedback delay (rows) at which the step is exactly `rate` x width: 1 h of 5-minute steps.
REFERENCE_DELAY = 12.0


@dataclass(frozen=True)
class Tracked:
    """Result of running the tracker over residual rows (origins in time order)."""

    lower_used: np.ndarray  # (rows, horizons): offsets in force at each row's origin
    upper_used: np.ndarray
    lower: np.ndarray  # (horizons,): offsets after absorbing every row
    upper: np.ndarray
    steps: int  # rows absorbed

    def inside(self, normalised: np.ndarray) -> np.ndarray:
        """Per row and horizon: did the interval in force at that origin cover the target?"""
        return (normalised >= self.lower_used) & (normalised <= self.upper_used)


def step_sizes(width: np.ndarray, delays: np.ndarray, rate: float) -> np.ndarray:
    """rate x reference width, slowed by (delay / REFERENCE_DELAY) ** DELAY_SLOWDOWN: a long
    horizon's misses arrive in clumps as long as its delay, and a fast step then overshoots;
    too slow a step, though, leaves a 4 h interval over-covering for days after a shift."""
    delays = np.maximum(np.asarray(delays, float), 1.0)
    return rate * np.asarray(width) / (delays / REFERENCE_DELAY) ** DELAY_SLOWDOWN


def reference_width(
    lower0: np.ndarray, upper0: np.ndarray, normalised: np.ndarray | None = None
) -> np.ndarray:
    """Per horizon, the width the step and the minimal band scale with: the initial interval,
    or twice the mean |normalised residual| when larger. A lumpy series whose demand mostly
    does not change has a split-conformal interval of width ~0 (over 80% of residuals are 0),
    which would freeze a tracker whose step is a share of it."""
    width = np.asarray(upper0, float) - np.asarray(lower0, float)
    if normalised is not None and normalised.shape[0]:
        width = np.maximum(width, 2.0 * np.mean(np.abs(normalised), axis=0))
    return np.maximum(width, MIN_REFERENCE_WIDTH)


def track(
    normalised: np.ndarray,
    lower0: np.ndarray,
    upper0: np.ndarray,
    delays: np.ndarray,
    *,
    rate: float,
    horizon_steps: np.ndarray | None = None,
    width: np.ndarray | None = None,
) -> Tracked:
    """Run the tracker over `normalised` residuals (rows: equally spaced origins, oldest first).

    Column j's residual of row i becomes known `delays[j]` rows later (its horizon in rows),
    so the offsets used at row i have absorbed rows <= i - delays[j] of column j. The step
    size follows `horizon_steps` (default: the delays, i.e. rows one step apart) and `width`
    (default: the initial interval width; see reference_width for lumpy series).
    """
    rows, columns = normalised.shape
    delays = np.asarray(delays, dtype=int)
    width = reference_width(lower0, upper0) if width is None else np.asarray(width, float)
    eta = step_sizes(width, delays if horizon_steps is None else horizon_steps, rate)
    min_half = 0.5 * MIN_WIDTH_SHARE * width
    windup = WINDUP_WIDTHS * width
    lower0 = np.minimum(np.array(lower0, dtype=float), -min_half)
    upper0 = np.maximum(np.array(upper0, dtype=float), min_half)
    lower_used, upper_used = np.empty((rows, columns)), np.empty((rows, columns))
    lower, upper = np.empty(columns), np.empty(columns)
    for column in range(columns):
        issued = _track_column(
            normalised[:, column].tolist(),
            float(lower0[column]),
            float(upper0[column]),
            int(delays[column]),
            float(eta[column]),
            float(min_half[column]),
            float(windup[column]),
        )
        lower_used[:, column], upper_used[:, column] = issued[0], issued[1]
        lower[column], upper[column] = issued[2], issued[3]
    return Tracked(lower_used, upper_used, lower, upper, rows)


def _track_column(
    residuals: list[float], lower: float, upper: float, delay: int, eta: float, min_half: float, windup: float
) -> tuple[list[float], list[float], float, float]:
    """One horizon's tracker: the offsets issued at each row, then the offsets handed on.

    Horizons do not interact, so each runs on its own over plain floats: a row's update is a
    few scalar operations, which Python does ~2x faster than numpy calls on a (horizons,)
    vector (measured on the 5-minute path's 288 x 12 replay; the results are bit-identical).
    """
    rows = len(residuals)
    high_rate, low_rate = 1.0 - UPPER_QUANTILE, LOWER_QUANTILE
    floor, neg_min_half = -windup, -min_half
    # Rows before the first reveal are issued with the starting offsets.
    first = min(delay, rows)
    upper_issued = [max(upper, min_half)] * first + [0.0] * (rows - first)
    lower_issued = [min(lower, -min_half)] * first + [0.0] * (rows - first)
    for row, residual in enumerate(residuals):  # revealed at row + delay
        # The miss is judged against the interval that was issued at that origin, not the
        # current one: then sum(miss - level) = (final - initial) / eta (up to the floor
        # below, which only errs towards covering), which bounds the long-run coverage error
        # even with the feedback delay. (A NaN residual compares False: a non-miss.)
        upper += eta * ((residual > upper_issued[row]) - high_rate)
        lower -= eta * ((residual < lower_issued[row]) - low_rate)
        # The issued interval always contains the point forecast and a minimal band, but the
        # state may pass it, down to `WINDUP_WIDTHS` widths: where fewer than 10% of
        # residuals fall on one side (a lumpy series whose demand mostly does not change,
        # a drift), a side at its floor cannot miss more, and a state clamped there would
        # absorb the credit that should offset the next burst's over-wide interval; the
        # banked credit keeps the long-run miss rate at its level as far as it can be.
        # (Comparisons, not max/min: builtin calls double the cost of this loop.)
        if upper < floor:
            upper = floor
        if lower > windup:
            lower = windup
        issued_at = row + delay
        if issued_at < rows:
            upper_issued[issued_at] = upper if upper > min_half else min_half
            lower_issued[issued_at] = lower if lower < neg_min_half else neg_min_half
    # The offsets handed on are the ones the next interval is issued with (the bank is not
    # carried: a live forecast replays its window afresh each tick).
    return lower_issued, upper_issued, min(lower, -min_half), max(upper, min_half)


def rolling_coverage(inside: np.ndarray, window: int) -> np.ndarray:
    """Share covered over the last `window` rows, per column (all rows when fewer)."""
    if inside.shape[0] == 0:
        return np.full(inside.shape[1], np.nan)
    return inside[-window:].mean(axis=0)


def tie_floor(residuals: np.ndarray) -> np.ndarray:
    """Per column, the least coverage of any interval that contains the point forecast and
    lets each side miss at most its 10%: 1 - min(0.1, share above) - min(0.1, share below).

    A target equal to the point (a tie: demand that did not move; a full or idle pool's
    usual case) is covered by every interval this tracker issues, so where ties are more
    than 80% of the rows the coverage reads above 0.8 with nothing left to narrow."""
    if residuals.shape[0] == 0:
        return np.full(residuals.shape[1:], np.nan)
    above = np.minimum(np.mean(residuals > 0, axis=0), 1.0 - UPPER_QUANTILE)
    below = np.minimum(np.mean(residuals < 0, axis=0), LOWER_QUANTILE)
    return 1.0 - above - below
