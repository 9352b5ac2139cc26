"""Rolling-origin model choice with a persistence guard, then conformal calibration.

The tail of the fit window is cut into contiguous folds; for each fold every candidate is
fitted only on origins whose targets end before the fold starts, then scored on the fold.
A challenger replaces persistence only when it beats it on the pooled validation error by
the configured margin, is not worse at the longest horizon, and wins at least half the folds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from market_pipeline.forecast.candidates import build_candidates
from market_pipeline.forecast.conformal import Calibration, adapt, calibrate
from market_pipeline.forecast.features import Series
from market_pipeline.forecast.models import PERSISTENCE, Candidate, Persistence
from market_pipeline.forecast.settings import LOWER_QUANTILE, UPPER_QUANTILE, ForecastSettings
from market_pipeline.forecast.survival import DemandContext

MIN_FOLD_ORIGINS = 12


@dataclass
class ValidationScore:
    mae_by_horizon: np.ndarray  # pooled over all folds
    fold_mae: np.ndarray  # one mean-over-horizons value per fold
    origin_error: np.ndarray  # mean absolute error over horizons, per validation origin

    @property
    def pooled(self) -> float:
        return float(np.mean(self.mae_by_horizon))


@dataclass
class FittedGroup:
    """The chosen forecaster for one set of horizons, ready to predict at any origin."""

    horizons: np.ndarray
    model: Candidate
    calibration: Calibration
    scores: dict[str, ValidationScore] = field(default_factory=dict)
    note: str | None = None
    clip_at_zero: bool = True

    @property
    def model_name(self) -> str:
        return self.model.name

    def validation_mae(self, name: str | None = None) -> np.ndarray | None:
        score = self.scores.get(name or self.model.name)
        return None if score is None else score.mae_by_horizon

    def predict(self, series: Series, origins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(low, median, high) per origin (rows) and horizon (columns)."""
        point = self.model.predict(series, origins, self.horizons)
        if self.clip_at_zero:
            point = np.maximum(point, 0.0)
        low, high = self.calibration.bounds(point, series, origins)
        if self.clip_at_zero:
            low = np.maximum(low, 0.0)
        return low, point, high


def validation_folds(
    last_origin: int, first_origin: int, settings: ForecastSettings, max_horizon: int
) -> list[np.ndarray]:
    """Contiguous origin blocks at the tail; empty when the history is too short to split."""
    usable = last_origin - first_origin + 1
    total = int(round(usable * settings.validation_fraction))
    folds = min(settings.validation_folds, total // MIN_FOLD_ORIGINS)
    if folds < 1 or usable - total <= max_horizon:
        return []
    per_fold = total // folds
    start = last_origin + 1 - per_fold * folds
    return [np.arange(start + k * per_fold, start + (k + 1) * per_fold) for k in range(folds)]


def _residuals(candidate: Candidate, series: Series, origins: np.ndarray, horizons: np.ndarray) -> np.ndarray:
    targets = series.values[origins[:, None] + horizons[None, :]]
    return targets - candidate.predict(series, origins, horizons)


def _validate(
    candidate: Candidate, series: Series, folds: list[np.ndarray], horizons: np.ndarray
) -> tuple[ValidationScore, np.ndarray, np.ndarray] | None:
    """Out-of-sample residuals over all folds, or None when a fold cannot be served."""
    if folds[0][0] < candidate.min_origin():
        return None
    max_horizon = int(horizons.max())
    origins = np.concatenate(folds)
    if candidate.data_free:
        # Nothing is fitted, so one pass over every fold's origins is the same as fold by fold.
        residuals = _residuals(candidate, series, origins, horizons)
    else:
        blocks = []
        for fold in folds:
            train = np.arange(candidate.min_origin(), fold[0] - max_horizon)
            if not candidate.fit(series, train, horizons):
                return None
            blocks.append(_residuals(candidate, series, fold, horizons))
        residuals = np.vstack(blocks)
    errors = np.abs(residuals)
    fold_ends = np.cumsum([fold.size for fold in folds])[:-1]
    fold_mae = np.array([block.mean() for block in np.split(errors, fold_ends)])
    return ValidationScore(errors.mean(axis=0), fold_mae, errors.mean(axis=1)), residuals, origins


def gain_t_statistic(reference_error: np.ndarray, candidate_error: np.ndarray, lag: int) -> float:
    """Diebold-Mariano statistic of the per-origin error reduction versus the reference.

    Overlapping multi-step errors are autocorrelated, so the variance of the mean gain uses a
    Newey-West (Bartlett) estimate with `lag` lags; positive means the candidate is better.
    """
    gain = reference_error - candidate_error
    count = gain.size
    centred = gain - gain.mean()
    lag = max(0, min(lag, count // 4))
    variance = float(centred @ centred) / count
    for k in range(1, lag + 1):
        variance += 2.0 * (1.0 - k / (lag + 1)) * float(centred[k:] @ centred[:-k]) / count
    if variance <= 0.0:
        return math.inf if gain.mean() > 0 else 0.0
    return float(gain.mean() / math.sqrt(variance / count))


def _choose(scores: dict[str, ValidationScore], settings: ForecastSettings, max_horizon: int) -> str:
    """Persistence unless a challenger is better by the margin, at the longest horizon, in
    most folds, and by a statistically clear gain (validation folds are short and noisy)."""
    reference = scores[PERSISTENCE]
    needed_wins = math.ceil(len(reference.fold_mae) / 2)
    best_name, best_pooled = PERSISTENCE, (1.0 - settings.choice_margin) * reference.pooled
    for name, score in scores.items():
        if name == PERSISTENCE:
            continue
        wins = int(np.sum(score.fold_mae < reference.fold_mae))
        if (
            score.pooled <= best_pooled
            and score.mae_by_horizon[-1] <= reference.mae_by_horizon[-1]
            and wins >= needed_wins
            and gain_t_statistic(reference.origin_error, score.origin_error, max_horizon)
            >= settings.choice_min_t
        ):
            best_name, best_pooled = name, score.pooled
    return best_name


def fit_group(
    series: Series,
    horizons: np.ndarray,
    settings: ForecastSettings,
    fallback: Calibration | None = None,
    *,
    step_minutes: int = 5,
    context: DemandContext | None = None,
) -> FittedGroup:
    """Choose, refit and calibrate a forecaster for `horizons` on the whole `series`."""
    max_horizon = int(horizons.max())
    last_origin = len(series) - 1 - max_horizon
    floor = settings.scale_floor_fraction * series.mean_abs_step()
    if last_origin < 0:
        return _persistence_only(
            series,
            horizons,
            settings,
            fallback,
            f"history of {len(series)} points is shorter than the {max_horizon}-step horizon",
        )
    if floor <= 0.0:
        return _persistence_only(series, horizons, settings, fallback, "constant history")
    candidates = build_candidates(settings, series, step_minutes=step_minutes, context=context)
    folds = validation_folds(last_origin, 0, settings, max_horizon)
    scores: dict[str, ValidationScore] = {}
    validation_residuals: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for candidate in candidates if folds else []:
        outcome = _validate(candidate, series, folds, horizons)
        if outcome is not None:
            score, residuals, origins = outcome
            scores[candidate.name] = score
            validation_residuals[candidate.name] = (residuals, origins)
    note = None
    if PERSISTENCE not in scores:
        chosen: Candidate = Persistence()
        note = "history too short for rolling-origin validation; persistence kept"
    else:
        chosen = next(c for c in candidates if c.name == _choose(scores, settings, max_horizon))
    chosen.fit(series, np.arange(chosen.min_origin(), last_origin + 1), horizons)
    if chosen.data_free:
        origins = np.arange(chosen.min_origin(), last_origin + 1)
        residuals = _residuals(chosen, series, origins, horizons)
    else:
        residuals, origins = validation_residuals[chosen.name]
    calibration = _calibration(series, horizons, settings, floor, residuals, origins, fallback)
    if calibration is None:
        return _persistence_only(
            series,
            horizons,
            settings,
            fallback,
            f"fewer than {settings.min_calibration_residuals} residuals to calibrate intervals",
        )
    return FittedGroup(horizons, chosen, calibration, scores, note, settings.clip_at_zero)


def _calibration(
    series: Series,
    horizons: np.ndarray,
    settings: ForecastSettings,
    floor: float,
    residuals: np.ndarray,
    origins: np.ndarray,
    fallback: Calibration | None,
) -> Calibration | None:
    if residuals.shape[0] >= settings.min_calibration_residuals:
        split = calibrate(
            residuals,
            series,
            origins,
            horizons,
            window=settings.scale_window_steps,
            floor=floor,
            lower_level=LOWER_QUANTILE,
            upper_level=UPPER_QUANTILE,
        )
        return adapt(
            split,
            residuals,
            series,
            origins,
            rate=settings.online_rate,
            window_rows=settings.online_window_rows,
            coverage_window=settings.coverage_window_rows,
        )
    return None if fallback is None else fallback.extrapolated(horizons)


def _persistence_only(
    series: Series, horizons: np.ndarray, settings: ForecastSettings, fallback: Calibration | None, note: str
) -> FittedGroup:
    """Persistence whose intervals come from 1-step changes (or `fallback`), grown by sqrt(h)."""
    calibration = fallback.extrapolated(horizons) if fallback is not None else None
    floor = settings.scale_floor_fraction * series.mean_abs_step()
    one_step = np.array([1])
    enough_changes = len(series) - 1 >= settings.min_calibration_residuals
    if calibration is None and floor > 0.0 and enough_changes:
        origins = np.arange(0, len(series) - 1)
        residuals = _residuals(Persistence(), series, origins, one_step)
        base = calibrate(
            residuals,
            series,
            origins,
            one_step,
            window=settings.scale_window_steps,
            floor=floor,
            lower_level=LOWER_QUANTILE,
            upper_level=UPPER_QUANTILE,
        )
        calibration = base.extrapolated(horizons)
    if calibration is None:
        raise ValueError("no calibration possible: the caller must use a fallback forecast")
    return FittedGroup(horizons, Persistence(), calibration, {}, note, settings.clip_at_zero)
