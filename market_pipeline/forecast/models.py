"""Candidate point forecasters: persistence, seasonal naive, exponential smoothing, learned
(the survival + arrival candidate is in survival.py; build_candidates in candidates.py).

Each predicts y[t + h] for origins t and horizons h (in steps) from data up to t only.
Learned models predict the change y[t + h] - y[t], so "no change" (persistence) is their
natural fallback and a penalty shrinks them towards it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
from scipy.signal import lfilter

from market_pipeline.forecast.features import (
    Series,
    feature_lookback,
    feature_matrix,
    seasonal_offsets,
    uses_seasonal_features,
)
from market_pipeline.forecast.settings import ForecastSettings

PERSISTENCE = "persistence"
SEASONAL_NAIVE = "seasonal_naive"
EXP_SMOOTHING = "exp_smoothing"
MIN_LEARNED_ROWS = 100
ES_ALPHAS = (0.1, 0.2, 0.35, 0.5, 0.7, 0.85)
GBM_MAX_ROWS = 30_000


class Candidate(ABC):
    name: ClassVar[str]
    # True when fit() learns nothing from the data, so in-sample residuals are honest
    # calibration material; False means only out-of-sample (validation) residuals are.
    data_free: ClassVar[bool] = False

    def min_origin(self) -> int:
        return 0

    def fit(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> bool:
        """Fit on (origin, horizon) pairs whose targets lie inside `series`; False if too few."""
        return True

    @abstractmethod
    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        """Point forecasts, shape (len(origins), len(horizons))."""


class Persistence(Candidate):
    name = PERSISTENCE
    data_free = True

    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        return np.repeat(series.values[origins][:, None], len(horizons), axis=1)


class SeasonalNaive(Candidate):
    """Value one period (a day) before the target time."""

    name = SEASONAL_NAIVE
    data_free = True

    def __init__(self, period: int) -> None:
        self.period = period

    def min_origin(self) -> int:
        return self.period - 1

    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        back = self.period * np.ceil(horizons / self.period).astype(int)
        return series.values[origins[:, None] + (horizons - back)[None, :]]


class ExpSmoothing(Candidate):
    """Simple exponential smoothing: a flat forecast at the smoothed level."""

    name = EXP_SMOOTHING
    warmup = 12

    def __init__(self) -> None:
        self.alpha_index = len(ES_ALPHAS) - 1

    @property
    def alpha(self) -> float:
        return ES_ALPHAS[self.alpha_index]

    def min_origin(self) -> int:
        return self.warmup

    def fit(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> bool:
        if origins.size == 0:
            return False
        targets = series.values[origins[:, None] + horizons[None, :]]
        levels = _smoothed_levels(series)[:, origins]  # (alphas, origins)
        errors = np.abs(targets[None, :, :] - levels[:, :, None]).mean(axis=(1, 2))
        self.alpha_index = int(np.argmin(errors))
        return True

    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        level = _smoothed_levels(series)[self.alpha_index, origins]
        return np.repeat(level[:, None], len(horizons), axis=1)


def _smoothed_levels(series: Series) -> np.ndarray:
    """Smoothed level for every alpha of the grid (rows), computed once per series."""

    def compute() -> np.ndarray:
        values = series.values
        return np.vstack(
            [
                lfilter([alpha], [1.0, alpha - 1.0], values, zi=[(1.0 - alpha) * values[0]])[0]
                for alpha in ES_ALPHAS
            ]
        )

    return series.memoised("smoothed", compute)


class _LearnedOnChanges(Candidate):
    """Shared feature plumbing of the learned models (lags, calendar, price)."""

    def __init__(self, settings: ForecastSettings, fit_length: int, period: int, with_price: bool) -> None:
        self.settings = settings
        self.seasonal = uses_seasonal_features(fit_length, period)
        self.with_price = with_price
        self.period = period

    def min_origin(self) -> int:
        return feature_lookback(self.seasonal, self.period)

    def features(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        offsets = seasonal_offsets(horizons, self.period) if self.seasonal else ()
        return feature_matrix(series, origins, seasonal_offsets=offsets, with_price=self.with_price)


class RidgeOnChanges(_LearnedOnChanges):
    """Direct multi-horizon robust ridge regression of the change on standardised features.

    Demand changes are mostly zero with rare large jumps, and the forecast is judged by
    absolute error, so plain least squares chases the jumps. Iteratively reweighted least
    squares with weights 1 / |residual| (shared across horizons, floored) approximates a
    median (least absolute deviation) fit at the cost of a few small solves.
    """

    name = "ridge"
    robust_iterations = 4

    def fit(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> bool:
        if origins.size < MIN_LEARNED_ROWS:
            return False
        features = self.features(series, origins, horizons)
        values = series.values
        changes = values[origins[:, None] + horizons[None, :]] - values[origins][:, None]
        self.mean = features.mean(axis=0)
        spread = features.std(axis=0)
        self.scale = np.where(spread > 1e-12, spread, 1.0)
        standard = (features - self.mean) / self.scale
        # Predictions clip features and changes to what training saw: a price or level outside
        # the training range must not be extrapolated linearly (measured: 2x persistence's
        # error on synthetic pools whose price drifted after the fit window).
        self.feature_low, self.feature_high = standard.min(axis=0), standard.max(axis=0)
        self.change_low, self.change_high = changes.min(axis=0), changes.max(axis=0)
        design = np.column_stack([standard, np.ones(origins.size)])
        penalty = np.full(design.shape[1], self.settings.ridge_alpha * origins.size)
        penalty[-1] = 0.0  # the intercept is not shrunk
        floor = max(0.1 * float(np.mean(np.abs(changes))), 1e-6)
        row_weight = np.ones(origins.size)
        penalty_matrix = np.diag(penalty)
        for _ in range(self.robust_iterations):
            weighted = design * row_weight[:, None]
            gram = weighted.T @ design + penalty_matrix
            coefficients = np.linalg.solve(gram, weighted.T @ changes)
            residual = np.mean(np.abs(changes - design @ coefficients), axis=1)
            row_weight = 1.0 / np.maximum(residual, floor)
        self.weights, self.intercept = coefficients[:-1], coefficients[-1]
        return True

    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        standard = (self.features(series, origins, horizons) - self.mean) / self.scale
        standard = np.clip(standard, self.feature_low, self.feature_high)
        change = np.clip(standard @ self.weights + self.intercept, self.change_low, self.change_high)
        return series.values[origins][:, None] + change


class GbmOnChanges(_LearnedOnChanges):
    """Quantile gradient boosting (the median) of the change on lags, calendar and price, with
    the horizon as a feature; its interval comes from the same online conformal layer."""

    name = "gbm"

    def fit(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> bool:
        if origins.size < MIN_LEARNED_ROWS:
            return False
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        stride = max(1, int(np.ceil(origins.size * horizons.size / GBM_MAX_ROWS)))
        rows = origins[::-1][::stride][::-1]  # keep the newest origins when thinning
        features, changes = self._stack(series, rows, horizons)
        self.model = HistGradientBoostingRegressor(
            loss="quantile",
            quantile=0.5,
            max_iter=self.settings.gbm_max_iter,
            learning_rate=self.settings.gbm_learning_rate,
            max_leaf_nodes=15,
            min_samples_leaf=40,
            early_stopping=False,
            random_state=0,
        )
        # One thread: these fits are small, and OpenMP workers spinning on a busy machine
        # made one pool's fit 30x slower (measured).
        with threadpool_limits(limits=1, user_api="openmp"):
            self.model.fit(features, changes)
        return True

    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        features, _ = self._stack(series, origins, horizons, with_targets=False)
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="openmp"):
            change = self.model.predict(features).reshape(origins.size, horizons.size)
        return series.values[origins][:, None] + change

    def _stack(
        self, series: Series, origins: np.ndarray, horizons: np.ndarray, with_targets: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        base = self.features(series, origins, horizons)
        repeated = np.repeat(base, horizons.size, axis=0)
        horizon_column = np.tile(horizons.astype(float), origins.size)[:, None]
        stacked = np.hstack([repeated, horizon_column])
        if not with_targets:
            return stacked, None
        values = series.values
        changes = values[origins[:, None] + horizons[None, :]] - values[origins][:, None]
        return stacked, changes.ravel()
