"""One pool's forecast: fit, choose, calibrate, predict from the newest point; or fall back."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

from market_pipeline.forecast.features import Series
from market_pipeline.forecast.history import (
    PreparedHistory,
    fallback_band,
    fallback_level,
    prepare_history,
)
from market_pipeline.forecast.models import PERSISTENCE
from market_pipeline.forecast.selection import FittedGroup, fit_group
from market_pipeline.forecast.settings import DEFAULT_SETTINGS, ForecastInputError, ForecastSettings
from market_pipeline.forecast.survival import DemandContext


@dataclass(frozen=True)
class PoolForecast:
    """Quantile forecast of one pool's demand from its newest point (the origin).

    Fine path: `horizon_steps` steps of `step_minutes`; coarse curve: `coarse_points` steps of
    `coarse_step_minutes` (hourly over 24 h by default). Validation errors are mean absolute
    errors of rolling-origin validation in GPUs; None when no validation was possible.
    """

    model: str
    model_version: str
    validation_mae: float | None  # chosen fine model at the longest fine horizon
    persistence_validation_mae: float | None  # persistence at the same horizon
    fallback_reason: str | None
    step_minutes: int
    q10: np.ndarray
    q50: np.ndarray
    q90: np.ndarray
    coarse_model: str
    coarse_step_minutes: int
    coarse_q10: np.ndarray
    coarse_q50: np.ndarray
    coarse_q90: np.ndarray
    coarse_fallback_reason: str | None = None
    validation_mae_by_horizon: np.ndarray | None = None
    coarse_validation_mae_by_horizon: np.ndarray | None = None
    validation_mae_by_model: dict[str, float] = field(default_factory=dict)
    history_points: int = 0
    # Online conformal: calibration rows the tracker has seen (0 = split conformal only or a
    # fallback band) and the share of the newest rows its intervals covered, per horizon.
    online_steps: int = 0
    coarse_online_steps: int = 0
    recent_coverage: np.ndarray | None = None
    coarse_recent_coverage: np.ndarray | None = None
    # The least coverage the same rows allow (ties: demand that did not move; see
    # online.tie_floor), per horizon.
    recent_tie_floor: np.ndarray | None = None
    coarse_recent_tie_floor: np.ndarray | None = None

    @property
    def chosen_by(self) -> str:
        """'fallback' (no fit), 'guard' (persistence kept: no challenger won out of sample)
        or 'validation' (a challenger beat persistence out of sample)."""
        if self.fallback_reason is not None:
            return "fallback"
        return "guard" if self.model == PERSISTENCE else "validation"

    @property
    def horizon_minutes(self) -> np.ndarray:
        return self.step_minutes * np.arange(1, self.q50.size + 1)

    @property
    def coarse_horizon_minutes(self) -> np.ndarray:
        return self.coarse_step_minutes * np.arange(1, self.coarse_q50.size + 1)

    def to_rows(self, pool_id: str, origin_ts: dt.datetime) -> list[dict[str, object]]:
        """Storage rows: the fine path, then coarse points beyond it (one row per horizon)."""
        rows = _rows(
            pool_id,
            origin_ts,
            self.horizon_minutes,
            (self.q10, self.q50, self.q90),
            self.model,
            self.model_version,
            self.validation_mae_by_horizon,
            self.fallback_reason,
        )
        beyond = self.coarse_horizon_minutes > self.horizon_minutes[-1]
        coarse_mae = self.coarse_validation_mae_by_horizon
        rows += _rows(
            pool_id,
            origin_ts,
            self.coarse_horizon_minutes[beyond],
            (self.coarse_q10[beyond], self.coarse_q50[beyond], self.coarse_q90[beyond]),
            self.coarse_model,
            self.model_version,
            None if coarse_mae is None else coarse_mae[beyond],
            self.coarse_fallback_reason,
        )
        return rows


def _rows(
    pool_id: str,
    origin_ts: dt.datetime,
    minutes: np.ndarray,
    quantiles: tuple[np.ndarray, np.ndarray, np.ndarray],
    model: str,
    version: str,
    maes: np.ndarray | None,
    reason: str | None,
) -> list[dict[str, object]]:
    low, mid, high = quantiles
    return [
        {
            "pool_id": pool_id,
            "origin_ts": origin_ts,
            "target_ts": origin_ts + dt.timedelta(minutes=int(minute)),
            "horizon_min": int(minute),
            "q10": float(low[i]),
            "q50": float(mid[i]),
            "q90": float(high[i]),
            "model": model,
            "model_version": version,
            "validation_mae": None if maes is None else float(maes[i]),
            "fallback_reason": reason,
        }
        for i, minute in enumerate(minutes)
    ]


def fit_and_forecast(
    history: np.ndarray,
    *,
    step_minutes: int = 5,
    horizon_steps: int = 12,
    price: np.ndarray | None = None,
    prior: float | None = None,
    settings: ForecastSettings | None = None,
    context: DemandContext | None = None,
) -> PoolForecast:
    """Forecast demand after the last point of `history` (one value per `step_minutes`).

    `context` (optional) is what the live loop knows about the tasks behind the demand
    (lifetimes, running ages, arrival rate) for the survival + arrival candidate. NaN marks
    a missing step. Never raises for short, gappy, constant or stale history (the
    forecast then falls back and says why); raises ForecastInputError for malformed input.
    """
    settings = settings or DEFAULT_SETTINGS
    if horizon_steps < 1:
        raise ForecastInputError(f"horizon_steps must be >= 1, got {horizon_steps}")
    if prior is not None and not (np.isfinite(prior) and prior >= 0):
        raise ForecastInputError(f"prior must be a finite non-negative demand, got {prior}")
    period, coarse_step = settings.steps(step_minutes)
    fine_horizons = np.arange(1, horizon_steps + 1)
    coarse_horizons = coarse_step * np.arange(1, settings.coarse_points + 1)
    prepared = prepare_history(history, price, settings)
    if prepared.reason is not None:
        return _fallback(
            prepared, prior, settings, step_minutes, fine_horizons, coarse_horizons, prepared.reason
        )
    series = Series(prepared.values, period, prepared.price)
    try:
        fine = fit_group(series, fine_horizons, settings, step_minutes=step_minutes, context=context)
        coarse = fit_group(
            series,
            coarse_horizons,
            settings,
            fallback=fine.calibration,
            step_minutes=step_minutes,
            context=context,
        )
    except (np.linalg.LinAlgError, ValueError, FloatingPointError) as exc:
        # A numerical failure on one pool must not stop the tick for every pool.
        return _fallback(
            prepared,
            prior,
            settings,
            step_minutes,
            fine_horizons,
            coarse_horizons,
            f"model fit failed ({type(exc).__name__}: {exc})",
        )
    return _from_groups(series, fine, coarse, settings, step_minutes)


def _from_groups(
    series: Series, fine: FittedGroup, coarse: FittedGroup, settings: ForecastSettings, step_minutes: int
) -> PoolForecast:
    origin = np.array([len(series) - 1])
    fine_q = [band[0] for band in fine.predict(series, origin)]
    coarse_q = [band[0] for band in coarse.predict(series, origin)]
    fine_mae = fine.validation_mae()
    persistence_mae = fine.validation_mae(PERSISTENCE)
    return PoolForecast(
        model=fine.model_name,
        model_version=settings.model_version(),
        validation_mae=None if fine_mae is None else float(fine_mae[-1]),
        persistence_validation_mae=None if persistence_mae is None else float(persistence_mae[-1]),
        fallback_reason=fine.note,
        step_minutes=step_minutes,
        q10=fine_q[0],
        q50=fine_q[1],
        q90=fine_q[2],
        coarse_model=coarse.model_name,
        coarse_step_minutes=settings.coarse_step_minutes,
        coarse_q10=coarse_q[0],
        coarse_q50=coarse_q[1],
        coarse_q90=coarse_q[2],
        coarse_fallback_reason=coarse.note,
        validation_mae_by_horizon=fine_mae,
        coarse_validation_mae_by_horizon=coarse.validation_mae(),
        validation_mae_by_model={
            name: float(score.mae_by_horizon[-1]) for name, score in fine.scores.items()
        },
        history_points=len(series),
        online_steps=fine.calibration.online_steps,
        coarse_online_steps=coarse.calibration.online_steps,
        recent_coverage=fine.calibration.recent_coverage,
        coarse_recent_coverage=coarse.calibration.recent_coverage,
        recent_tie_floor=fine.calibration.recent_tie_floor,
        coarse_recent_tie_floor=coarse.calibration.recent_tie_floor,
    )


def _fallback(
    prepared: PreparedHistory,
    prior: float | None,
    settings: ForecastSettings,
    step_minutes: int,
    fine_horizons: np.ndarray,
    coarse_horizons: np.ndarray,
    reason: str,
) -> PoolForecast:
    level, source = fallback_level(prepared, prior, settings)
    steps_per_hour = max(1, 60 // step_minutes)
    fine = fallback_band(level, fine_horizons, steps_per_hour, prepared.mean_abs_step, settings)
    coarse = fallback_band(level, coarse_horizons, steps_per_hour, prepared.mean_abs_step, settings)
    return PoolForecast(
        model=source,
        model_version=settings.model_version(),
        validation_mae=None,
        persistence_validation_mae=None,
        fallback_reason=reason,
        step_minutes=step_minutes,
        q10=fine[0],
        q50=fine[1],
        q90=fine[2],
        coarse_model=source,
        coarse_step_minutes=settings.coarse_step_minutes,
        coarse_q10=coarse[0],
        coarse_q50=coarse[1],
        coarse_q90=coarse[2],
        coarse_fallback_reason=reason,
        history_points=int(prepared.values.size),
    )
