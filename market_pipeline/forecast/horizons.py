"""Reading a forecast at the horizon a caller needs (5 minutes to 24 hours).

A PoolForecast holds a fine path (`step_minutes` steps up to the fine horizon, 1 h by
default) and an hourly coarse curve to 24 h; both are calibrated by the online conformal
tracker per horizon. These functions merge the two (fine first, coarse points beyond it) and
interpolate linearly between stored horizons, so the scaling policy (boot times, hysteresis
over hours) and the backlog certificate can ask for any horizon in minutes:

    upper_quantile_at(result, 240)   # q90 of demand 4 h after the origin
    quantile_at(result, 90, "q50")   # median 90 minutes ahead

Horizons shorter than the first stored step read the first step (the forecast says nothing
finer); horizons past the last stored point are an error, never an extrapolation.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from market_pipeline.forecast.pool import PoolForecast
from market_pipeline.forecast.settings import ForecastInputError

Level = Literal["q10", "q50", "q90"]


def _forecast_of(result: object) -> PoolForecast:
    forecast = getattr(result, "forecast", result)  # a PoolResult or a PoolForecast
    if not isinstance(forecast, PoolForecast):
        raise ForecastInputError(f"expected a PoolForecast or PoolResult, got {type(result).__name__}")
    return forecast


def quantile_curve(result: object) -> dict[str, np.ndarray]:
    """Minutes ahead and q10/q50/q90, the fine path followed by coarse points beyond it."""
    forecast = _forecast_of(result)
    beyond = forecast.coarse_horizon_minutes > forecast.horizon_minutes[-1]
    return {
        "minutes": np.concatenate([forecast.horizon_minutes, forecast.coarse_horizon_minutes[beyond]]).astype(
            float
        ),
        "q10": np.concatenate([forecast.q10, forecast.coarse_q10[beyond]]),
        "q50": np.concatenate([forecast.q50, forecast.coarse_q50[beyond]]),
        "q90": np.concatenate([forecast.q90, forecast.coarse_q90[beyond]]),
    }


def quantile_at(result: object, horizon_minutes: float, level: Level = "q90") -> float:
    """`level` of demand `horizon_minutes` after the forecast's origin (see module doc)."""
    if level not in ("q10", "q50", "q90"):
        raise ForecastInputError(f"level must be q10, q50 or q90, got {level!r}")
    if not (np.isfinite(horizon_minutes) and horizon_minutes > 0):
        raise ForecastInputError(f"horizon_minutes must be finite and > 0, got {horizon_minutes!r}")
    curve = quantile_curve(result)
    minutes = curve["minutes"]
    if horizon_minutes > minutes[-1]:
        raise ForecastInputError(
            f"horizon {horizon_minutes:g} min is beyond the forecast's last point ({minutes[-1]:g} min)"
        )
    return float(np.interp(horizon_minutes, minutes, curve[level]))


def upper_quantile_at(result: object, horizon_minutes: float) -> float:
    """q90 of demand `horizon_minutes` ahead: what capacity and the backlog certificate size to."""
    return quantile_at(result, horizon_minutes, "q90")
