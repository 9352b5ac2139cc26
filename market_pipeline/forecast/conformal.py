"""Conformal prediction intervals, normalised by recent volatility, adapted online.

Residuals are divided by a scale known at the origin (mean |1-step change| over the last
`window` steps plus a floor), so intervals widen in busy periods and narrow in quiet ones.
Split conformal gives the starting quantiles of the normalised residuals; `adapt` then runs
the online quantile tracker (online.py) over the newest calibration rows, so the quantiles
in force follow the pool's recent misses, and records how many steps it has seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from market_pipeline.forecast.features import Series
from market_pipeline.forecast.online import reference_width, rolling_coverage, tie_floor, track


@dataclass(frozen=True)
class Calibration:
    horizons: np.ndarray
    lower: np.ndarray  # per-horizon quantile of normalised residual at the lower level
    upper: np.ndarray
    window: int
    floor: float
    residual_count: int
    # Online adaptation: rows the tracker absorbed (0 = split conformal only) and the share
    # of the newest rows it covered, per horizon (None when not adapted).
    online_steps: int = 0
    recent_coverage: np.ndarray | None = None
    step_width: np.ndarray | None = None  # the tracker's reference width per horizon
    # The least coverage those same rows allow (online.tie_floor): above 0.8 where demand
    # mostly did not move, which every issued interval covers.
    recent_tie_floor: np.ndarray | None = None

    def scale(self, series: Series, origins: np.ndarray) -> np.ndarray:
        return series.trailing_abs_step(origins, self.window) + self.floor

    def bounds(self, point: np.ndarray, series: Series, origins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Interval around point forecasts (origins x horizons), never excluding the point."""
        scale = self.scale(series, origins)[:, None]
        low = np.minimum(point + self.lower[None, :] * scale, point)
        high = np.maximum(point + self.upper[None, :] * scale, point)
        return low, high

    def extrapolated(self, horizons: np.ndarray) -> Calibration:
        """Bounds for horizons without enough residuals: the widest calibrated horizon's
        quantiles grown like a random walk (sqrt of the horizon ratio); never narrower."""
        base = int(np.argmax(self.horizons))
        base_horizon = float(self.horizons[base])
        growth = np.sqrt(np.maximum(horizons / base_horizon, 1.0))
        return Calibration(
            horizons,
            self.lower[base] * growth,
            self.upper[base] * growth,
            self.window,
            self.floor,
            self.residual_count,
            self.online_steps,
        )


def conformal_quantiles(
    normalised: np.ndarray, lower_level: float, upper_level: float
) -> tuple[np.ndarray, np.ndarray]:
    """Finite-sample split-conformal order statistics per column (horizon).

    With n residuals the lower bound is the floor(lower * (n + 1))-th smallest and the upper
    the ceil(upper * (n + 1))-th smallest (clamped to the sample), as in split conformal.
    """
    count = normalised.shape[0]
    ordered = np.sort(normalised, axis=0)
    low_rank = min(max(math.floor(lower_level * (count + 1)), 1), count) - 1
    high_rank = min(max(math.ceil(upper_level * (count + 1)), 1), count) - 1
    return ordered[low_rank], ordered[high_rank]


def calibrate(
    residuals: np.ndarray,
    series: Series,
    origins: np.ndarray,
    horizons: np.ndarray,
    *,
    window: int,
    floor: float,
    lower_level: float,
    upper_level: float,
) -> Calibration:
    """Calibration from residuals (origins x horizons) observed at the given origins."""
    if floor <= 0.0:
        raise ValueError("the scale floor must be positive (constant series fall back earlier)")
    scale = series.trailing_abs_step(origins, window) + floor
    lower, upper = conformal_quantiles(residuals / scale[:, None], lower_level, upper_level)
    return Calibration(horizons, lower, upper, window, floor, int(residuals.shape[0]))


def adapt(
    calibration: Calibration,
    residuals: np.ndarray,
    series: Series,
    origins: np.ndarray,
    *,
    rate: float,
    window_rows: int,
    coverage_window: int,
) -> Calibration:
    """Start from `calibration` and track the newest residual rows (consecutive origins,
    oldest first), each horizon's feedback delayed by its horizon.

    Rows are taken every g steps, g the horizons' common divisor (1 for the 5-minute path,
    the coarse step for the hourly curve): one replayed row per coarse step keeps the cost
    of a stateless replay per tick small while covering days of the coarse curve's history.
    """
    if rate <= 0.0 or residuals.shape[0] == 0:
        return calibration
    horizons = calibration.horizons.astype(int)
    stride = int(np.gcd.reduce(horizons))
    newest_first = np.arange(residuals.shape[0] - 1, -1, -stride)[:window_rows]
    rows = newest_first[::-1]
    normalised = residuals[rows] / calibration.scale(series, origins[rows])[:, None]
    width = reference_width(calibration.lower, calibration.upper, normalised)
    tracked = track(
        normalised,
        calibration.lower,
        calibration.upper,
        horizons // stride,
        rate=rate,
        horizon_steps=horizons,
        width=width,
    )
    coverage = rolling_coverage(tracked.inside(normalised), coverage_window)
    return Calibration(
        calibration.horizons,
        tracked.lower,
        tracked.upper,
        calibration.window,
        calibration.floor,
        calibration.residual_count,
        tracked.steps,
        coverage,
        width,
        tie_floor(normalised[-coverage_window:]),
    )
