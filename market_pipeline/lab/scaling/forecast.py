"""A light causal upper-quantile forecaster of a pool's demand level.

The live loop passes the forecast module's upper quantile to `plan_pool`; replays and tests
that have no forecast use this one. It sees only the past: at each minute it predicts the
demand over the next `horizon_minutes` — its mean (`statistic="mean"`, the arrival rate a
drift certificate needs; the default) or its peak (`"max"`) — as the current level plus
the `quantile` of the rises of that statistic seen over the last `history_minutes`, plus
the positive part of the recent trend (off by default: in step-like GPU demand a single
job start reads as a trend and inflates the forecast for the whole trend window). The
rise quantile is refreshed every `refresh_minutes`.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class ForecastInputError(ValueError):
    """A demand sample or a forecaster setting is invalid."""


class CausalQuantileForecaster:
    def __init__(
        self,
        horizon_minutes: int = 5,
        quantile: float = 0.9,
        history_minutes: int = 3 * 1440,
        refresh_minutes: int = 60,
        trend_minutes: int = 0,
        cold_start_rise_fraction: float = 0.1,
        statistic: str = "mean",
    ) -> None:
        if horizon_minutes < 1:
            raise ForecastInputError(f"horizon_minutes: must be >= 1, got {horizon_minutes}")
        if not 0 < quantile < 1:
            raise ForecastInputError(f"quantile: must be in (0, 1), got {quantile}")
        if history_minutes <= horizon_minutes:
            raise ForecastInputError("history_minutes: must exceed horizon_minutes")
        if refresh_minutes < 1 or trend_minutes < 0:
            raise ForecastInputError("refresh_minutes must be >= 1 and trend_minutes >= 0")
        if statistic not in ("max", "mean"):
            raise ForecastInputError(f"statistic: must be 'max' or 'mean', got {statistic!r}")
        self.statistic = statistic
        self.horizon = horizon_minutes
        self.quantile = quantile
        self.refresh = refresh_minutes
        self.trend_minutes = trend_minutes
        self.cold_start_rise_fraction = cold_start_rise_fraction
        self._history: deque[float] = deque(maxlen=history_minutes)
        self._recent: deque[float] = deque(maxlen=2 * (trend_minutes // 2))
        self._since_refresh = 0
        self._rise_q: float | None = None

    def observe(self, demand: float) -> None:
        if not (math.isfinite(demand) and demand >= 0):
            raise ForecastInputError(f"demand: must be finite and >= 0, got {demand!r}")
        self._history.append(float(demand))
        self._recent.append(float(demand))
        self._since_refresh += 1
        if self._rise_q is None or self._since_refresh >= self.refresh:
            self._refresh_rise_quantile()

    def forecast(self) -> float:
        """Upper quantile of the demand level over the next horizon (0 before any sample)."""
        if not self._history:
            return 0.0
        level = self._history[-1]
        rise = self._rise_q if self._rise_q is not None else self.cold_start_rise_fraction * level
        return level + rise + self._trend_rise()

    def _refresh_rise_quantile(self) -> None:
        self._since_refresh = 0
        if len(self._history) <= self.horizon:
            self._rise_q = None
            return
        series = np.fromiter(self._history, dtype=float)
        windows = np.lib.stride_tricks.sliding_window_view(series[1:], self.horizon)
        future = windows.max(axis=1) if self.statistic == "max" else windows.mean(axis=1)
        rises = np.maximum(future - series[: future.size], 0.0)
        self._rise_q = float(np.quantile(rises, self.quantile))

    def _trend_rise(self) -> float:
        """Positive drift of the last window's mean over the one before, over the horizon."""
        w = self.trend_minutes // 2
        if w == 0 or len(self._recent) < 2 * w:
            return 0.0
        recent = list(self._recent)
        slope = (sum(recent[w:]) - sum(recent[:w])) / (w * w)
        return max(0.0, slope) * self.horizon


def causal_forecast_series(demand: np.ndarray, forecaster: CausalQuantileForecaster) -> np.ndarray:
    """Forecast made after each minute (entry m uses demand[: m + 1] only)."""
    out = np.empty(demand.size, dtype=float)
    for m, value in enumerate(demand):
        forecaster.observe(float(value))
        out[m] = forecaster.forecast()
    return out
