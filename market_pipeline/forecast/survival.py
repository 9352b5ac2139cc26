"""Survival + arrival candidate: how much of today's demand is still there at t + h, plus what
arrives meanwhile.

Demand at t + h = the running tasks that survive h + the GPUs of tasks that arrive in
(t, t + h] and survive to t + h. With arrival rate lam (GPUs per minute) and lifetime survival
S, arrivals add lam * integral_0^h S(u) du; a task of age a survives h with S(a + h) / S(a).

What the live loop can pass (`DemandContext`): the workload's completed task lifetimes (an
empirical S), and the running (and pending, age 0) tasks' ages and GPUs. Then

- at the newest origin, running demand survives task by task from the actual ages;
- at past origins (validation, backtests) the ages are unknown, so the stationary residual
  life survival R(h) = E[(L - h)+] / E[L] stands in for them (the age mix of an M/G/infinity
  queue in equilibrium), and the level fed by arrivals, m = lam * E[L], is the trailing mean
  of demand unless the caller passes lam.

Without a context (the Helios backtests: per-minute GPU counts, no task list) R(h) is fitted
per horizon from the series by least absolute deviation over a grid on [0, 1]; that reduces
the candidate to mean reversion towards the trailing level, an approximation, not task data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market_pipeline.forecast.features import Series
from market_pipeline.forecast.models import MIN_LEARNED_ROWS, Candidate
from market_pipeline.forecast.settings import ForecastInputError

SURVIVAL = "survival"
SURVIVAL_GRID = np.linspace(0.0, 1.0, 21)


@dataclass(frozen=True)
class DemandContext:
    """What the live loop knows about the tasks behind a pool's demand (all in minutes/GPUs).

    lifetime_minutes: completed task lifetimes of the workload (any sample, e.g. the last
    week's finished tasks); running_age_minutes / running_gpus: one entry per running or
    pending task (pending ones age 0); arrival_gpus_per_minute: the arrival-rate model's
    current rate, or None to infer the arrival-fed level from the demand history.
    """

    lifetime_minutes: np.ndarray
    running_age_minutes: np.ndarray
    running_gpus: np.ndarray
    arrival_gpus_per_minute: float | None = None

    def __post_init__(self) -> None:
        lifetimes = np.asarray(self.lifetime_minutes, dtype=float)
        if (
            lifetimes.ndim != 1
            or lifetimes.size == 0
            or not np.isfinite(lifetimes).all()
            or (lifetimes <= 0).any()
        ):
            raise ForecastInputError(
                "context lifetime_minutes must be a non-empty 1-D array of finite positive minutes"
            )
        ages = np.asarray(self.running_age_minutes, dtype=float)
        gpus = np.asarray(self.running_gpus, dtype=float)
        if ages.shape != gpus.shape or ages.ndim != 1:
            raise ForecastInputError(
                "context running_age_minutes and running_gpus must be 1-D arrays of equal length"
            )
        if (ages < 0).any() or (gpus < 0).any() or not (np.isfinite(ages).all() and np.isfinite(gpus).all()):
            raise ForecastInputError("context ages and GPUs must be finite and >= 0")
        rate = self.arrival_gpus_per_minute
        if rate is not None and not (np.isfinite(rate) and rate >= 0):
            raise ForecastInputError(f"context arrival_gpus_per_minute must be finite and >= 0, got {rate}")

    def residual_survival(self, minutes: np.ndarray) -> np.ndarray:
        """R(h) = E[(L - h)+] / E[L]: share of equilibrium running demand alive after h."""
        lifetimes = np.asarray(self.lifetime_minutes, dtype=float)
        excess = np.maximum(lifetimes[None, :] - np.asarray(minutes, float)[:, None], 0.0)
        return excess.mean(axis=1) / lifetimes.mean()

    def surviving_running(self, minutes: np.ndarray) -> np.ndarray:
        """GPUs of today's tasks still running after each horizon, from their ages."""
        lifetimes = np.sort(np.asarray(self.lifetime_minutes, dtype=float))
        ages = np.asarray(self.running_age_minutes, dtype=float)
        gpus = np.asarray(self.running_gpus, dtype=float)
        alive_now = _tail_share(lifetimes, ages)
        later = _tail_share(lifetimes, ages[None, :] + np.asarray(minutes, float)[:, None])
        # A task older than every sampled lifetime has no estimate: assume it stays (the
        # conservative side for capacity).
        ratio = np.where(alive_now > 0, later / np.where(alive_now > 0, alive_now, 1.0), 1.0)
        return ratio @ gpus


def _tail_share(sorted_lifetimes: np.ndarray, minutes: np.ndarray) -> np.ndarray:
    """Empirical S(x) = share of lifetimes > x."""
    below = np.searchsorted(sorted_lifetimes, minutes, side="right")
    return 1.0 - below / sorted_lifetimes.size


class SurvivalArrival(Candidate):
    """y[t+h] = m_t + R(h) * (y_t - m_t): surviving demand plus the arrival-fed remainder."""

    name = SURVIVAL

    def __init__(self, level_window: int, step_minutes: int, context: DemandContext | None = None) -> None:
        self.level_window = level_window
        self.step_minutes = step_minutes
        self.context = context
        self.survival: np.ndarray | None = None

    def min_origin(self) -> int:
        return self.level_window

    def _level(self, series: Series, origins: np.ndarray) -> np.ndarray:
        return series.trailing_mean(origins, self.level_window)

    def fit(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> bool:
        if self.context is not None:
            self.survival = self.context.residual_survival(horizons * self.step_minutes)
            return True
        if origins.size < MIN_LEARNED_ROWS:
            return False
        level = self._level(series, origins)[:, None]
        gap = series.values[origins][:, None] - level
        deviation = series.values[origins[:, None] + horizons[None, :]] - level
        # Mean absolute error of every grid value (rows) for every horizon (columns); one
        # scratch array serves every grid value (this fit runs per pool, fold and refit).
        scratch = np.empty_like(deviation)
        errors = np.empty((SURVIVAL_GRID.size, horizons.size))
        for index, share in enumerate(SURVIVAL_GRID):
            np.subtract(deviation, share * gap, out=scratch)
            np.abs(scratch, out=scratch)
            errors[index] = scratch.mean(axis=0)
        self.survival = SURVIVAL_GRID[np.argmin(errors, axis=0)]
        return True

    def predict(self, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        if self.survival is None:
            raise RuntimeError("SurvivalArrival.predict before fit")
        level = self._level(series, origins)[:, None]
        values = series.values[origins][:, None]
        point = level + self.survival[None, :] * (values - level)
        newest = origins == len(series) - 1
        if self.context is not None and self.context.running_gpus.size and newest.any():
            point[newest] = self._from_ages(level[newest, 0], horizons)
        return point

    def _from_ages(self, level: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        minutes = horizons * self.step_minutes
        context = self.context
        rate = context.arrival_gpus_per_minute
        arrived_level = (
            level if rate is None else np.full_like(level, rate * float(np.mean(context.lifetime_minutes)))
        )
        arrivals = arrived_level[:, None] * (1.0 - context.residual_survival(minutes))[None, :]
        return context.surviving_running(minutes)[None, :] + arrivals
