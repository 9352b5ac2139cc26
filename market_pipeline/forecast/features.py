"""A gap-free demand series and the backward-looking features computed from it.

Every feature at origin t reads only indices <= t, so the same code serves fitting,
rolling-origin validation and the backtest without look-ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

# Few, well-separated features: demand histories are short and strongly autocorrelated, so a
# wide lag set overfits (measured on price-driven synthetic demand: an earlier 29-feature set
# lost to persistence on every seed, this compact one beats it when price matters).
MOMENTUM_LAGS = (1, 3, 12)
SHORT_MEAN_WINDOW = 48
PRICE_LAGS = (12,)
SHORT_LOOKBACK = max(max(MOMENTUM_LAGS), SHORT_MEAN_WINDOW)


@dataclass(frozen=True, eq=False)
class Series:
    """Demand on a regular grid (no NaN) with optional aligned price."""

    values: np.ndarray
    period: int
    price: np.ndarray | None = None
    # Derived whole-series arrays (smoothed levels, feature matrices) shared by every fold.
    _memo: dict[object, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.values.ndim != 1:
            raise ValueError("Series.values must be 1-D")
        if self.price is not None and self.price.shape != self.values.shape:
            raise ValueError("Series.price must align with Series.values")

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @cached_property
    def _cumsum(self) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(self.values)])

    @cached_property
    def _abs_step_cumsum(self) -> np.ndarray:
        steps = np.abs(np.diff(self.values, prepend=self.values[:1]))
        return np.concatenate([[0.0], np.cumsum(steps)])

    def trailing_mean(self, origins: np.ndarray, window: int) -> np.ndarray:
        """Mean of y over the `window` points ending at each origin (fewer near the start)."""
        start = np.maximum(origins + 1 - window, 0)
        return (self._cumsum[origins + 1] - self._cumsum[start]) / (origins + 1 - start)

    def trailing_abs_step(self, origins: np.ndarray, window: int) -> np.ndarray:
        """Mean |y[i] - y[i-1]| over the `window` steps ending at each origin."""
        start = np.maximum(origins + 1 - window, 1)
        count = np.maximum(origins + 1 - start, 1)
        return (self._abs_step_cumsum[origins + 1] - self._abs_step_cumsum[start]) / count

    def mean_abs_step(self) -> float:
        """Mean |1-step change| over the whole series."""
        if len(self) < 2:
            return 0.0
        return float(self._abs_step_cumsum[-1] / (len(self) - 1))

    def memoised(self, key: object, compute: Callable[[], np.ndarray]) -> np.ndarray:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


def uses_seasonal_features(fit_length: int, period: int) -> bool:
    """Yesterday's path is only worth learning from with at least three days of history."""
    return fit_length >= 3 * period


def feature_lookback(seasonal: bool, period: int) -> int:
    return period if seasonal else SHORT_LOOKBACK


def seasonal_offsets(horizons: np.ndarray, period: int) -> tuple[int, ...]:
    """Where in yesterday's path to look for a horizon set: now, mid-horizon, end of horizon.

    Feature y[t - period + k] - y[t] at k = 0 and k = h tells what happened yesterday over the
    coming h steps; three offsets let one linear model serve the whole horizon set.
    """
    longest = int(horizons.max())
    return tuple(sorted({0, longest // 2, longest} & set(range(period))))


def feature_matrix(
    series: Series, origins: np.ndarray, *, seasonal_offsets: tuple[int, ...], with_price: bool
) -> np.ndarray:
    """Features at each origin (rows); empty offsets mean no seasonal features.

    Callers keep origins >= feature_lookback(bool(seasonal_offsets), period).
    """
    lookback = feature_lookback(bool(seasonal_offsets), series.period)
    if origins.size and origins.min() < lookback:
        raise ValueError(f"feature origins start at {origins.min()}, before lookback {lookback}")
    key = ("features", seasonal_offsets, with_price)
    every = series.memoised(
        key, lambda: _features_at(series, np.arange(lookback, len(series)), seasonal_offsets, with_price)
    )
    return every[origins - lookback]


def _features_at(
    series: Series, origins: np.ndarray, offsets: tuple[int, ...], with_price: bool
) -> np.ndarray:
    y = series.values
    level = y[origins]
    columns = [level] + [level - y[origins - lag] for lag in MOMENTUM_LAGS]
    columns.append(level - series.trailing_mean(origins, SHORT_MEAN_WINDOW))
    if offsets:
        columns.append(level - series.trailing_mean(origins, series.period))
        columns += [y[origins - series.period + offset] - level for offset in offsets]
    phase = 2.0 * np.pi * (origins % series.period) / series.period
    columns += [np.sin(phase), np.cos(phase)]
    if with_price and series.price is not None:
        columns += price_columns(series.price, origins)
    return np.column_stack(columns)


def price_columns(price: np.ndarray, origins: np.ndarray) -> list[np.ndarray]:
    # Log prices: a pool's price scale only shifts the level column, which the intercept and
    # the fit-time standardisation absorb; nothing here looks past the origin.
    log_price = np.log1p(price)
    now = log_price[origins]
    return [now] + [now - log_price[np.maximum(origins - lag, 0)] for lag in PRICE_LAGS]


def price_varies(price: np.ndarray | None) -> bool:
    if price is None or price.size < 2:
        return False
    spread = float(np.max(price) - np.min(price))
    return spread > 1e-9 * max(float(np.max(np.abs(price))), 1.0)
