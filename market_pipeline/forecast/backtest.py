"""Rolling-origin backtest on a Helios virtual-cluster trace.

Protocol: 5-minute means of running_gpu_num + pending_gpu_num (bucket = minute floored to a
multiple of 5); the first 60% of points fit, validate and calibrate the forecaster; then every
origin of the remaining 40% with a target inside the series is forecast `horizon` ahead, as
the live loop would: the model is chosen and refitted every `refit_every` steps on the data
up to that origin (at most `max_history_points` of it), and the online conformal tracker (online.py) absorbs each residual at the
moment its target is observed (origin + horizon), never earlier. Nothing after an origin
feeds that origin's forecast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.forecast.features import Series
from market_pipeline.forecast.online import tie_floor, track
from market_pipeline.forecast.selection import FittedGroup, fit_group
from market_pipeline.forecast.settings import (
    DEFAULT_SETTINGS,
    LOWER_QUANTILE,
    UPPER_QUANTILE,
    ForecastInputError,
    ForecastSettings,
)

HELIOS_COLUMNS = ("time", "running_gpu_num", "pending_gpu_num")


def load_helios_series(path: str | Path, step_minutes: int = 5) -> np.ndarray:
    """Demand (running + pending GPUs) as `step_minutes` means, oldest first, gap-free."""
    import polars as pl

    try:
        path = checked_file(path, "series file")
    except InputFileError as exc:
        raise ForecastInputError(str(exc)) from None
    missing = [column for column in HELIOS_COLUMNS if column not in _header(path)]
    if missing:
        raise ForecastInputError(f"{path}: missing column(s) {', '.join(missing)}")
    try:
        frame = pl.read_csv(path, columns=list(HELIOS_COLUMNS), try_parse_dates=True)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ForecastInputError(f"{path}: unreadable as CSV ({' '.join(str(exc).split())[:160]})") from None
    if frame.height == 0:
        raise ForecastInputError(f"{path}: the file has a header but no rows")
    for column in HELIOS_COLUMNS[1:]:
        if not frame.schema[column].is_numeric():
            raise ForecastInputError(f"{path}: column {column} must hold numbers, not {frame.schema[column]}")
    if not isinstance(frame.schema["time"], pl.Datetime):
        frame = frame.with_columns(pl.col("time").cast(pl.String).str.to_datetime(strict=False))
    nulls = frame.null_count().row(0, named=True)
    bad = {name: count for name, count in nulls.items() if count}
    if bad:
        raise ForecastInputError(f"{path}: null or unparseable values in {bad}")
    buckets = (
        frame.group_by(pl.col("time").dt.truncate(f"{step_minutes}m").alias("bucket"))
        .agg((pl.col("running_gpu_num") + pl.col("pending_gpu_num")).mean().alias("demand"))
        .sort("bucket")
    )
    steps = buckets["bucket"].diff().drop_nulls().dt.total_minutes().to_numpy()
    if steps.size and (steps != step_minutes).any():
        raise ForecastInputError(
            f"{path}: {int(np.sum(steps != step_minutes))} irregular "
            f"gaps between {step_minutes}-minute buckets"
        )
    return buckets["demand"].to_numpy().astype(float)


def _header(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8") as handle:
            return [name.strip() for name in handle.readline(64 * 1024).split(",")]
    except UnicodeDecodeError as exc:
        raise ForecastInputError(f"{path}: not UTF-8 text (byte {exc.start}); expected a CSV") from None


@dataclass
class BacktestResult:
    mae: float  # median forecast, at the horizon step
    persistence_mae: float
    seasonal_naive_mae: float | None
    coverage_80: float  # share of targets inside [q10, q90]
    pinball_loss: float  # mean of the q10, q50 and q90 pinball losses
    chosen_model: str
    origins: int
    horizon_steps: int
    step_minutes: int
    points: int
    fit_points: int
    mae_mean_over_steps: float
    persistence_mae_mean_over_steps: float
    coverage_80_mean_over_steps: float
    interval_width_mean: float
    validation_mae_by_model: dict[str, float] = field(default_factory=dict)
    selection_note: str | None = None
    refits: int = 0
    chosen_models: dict[str, int] = field(default_factory=dict)  # refits that chose each model
    coverage_80_daily_min: float | None = None  # worst 1-day window at the horizon step
    coverage_80_daily_max: float | None = None
    tie_share: float | None = None  # targets exactly equal to the median forecast
    coverage_80_tie_floor: float | None = None  # see daily_tie_floor()

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def pinball(target: np.ndarray, quantile_forecast: np.ndarray, level: float) -> float:
    gap = target - quantile_forecast
    return float(np.mean(np.maximum(level * gap, (level - 1.0) * gap)))


def backtest_series(
    values: np.ndarray,
    *,
    horizon_steps: int = 12,
    step_minutes: int = 5,
    train_fraction: float = 0.6,
    refit_every: int | None = None,
    settings: ForecastSettings | None = None,
) -> BacktestResult:
    """Rolling-origin backtest; `refit_every` defaults to one day of steps."""
    settings = settings or DEFAULT_SETTINGS
    period, _ = settings.steps(step_minutes)
    refit_every = refit_every or period
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ForecastInputError("backtest series must be one-dimensional and gap-free")
    if refit_every < 1:
        raise ForecastInputError(f"refit_every must be >= 1, got {refit_every}")
    fit_points = int(values.size * train_fraction)
    origins = np.arange(fit_points, values.size - horizon_steps)
    if origins.size == 0 or fit_points < settings.min_history_points:
        raise ForecastInputError(
            f"series of {values.size} points is too short to backtest a {horizon_steps}-step horizon"
        )
    horizons = np.arange(1, horizon_steps + 1)
    point, scale, first, names = _rolling_points(
        values, origins, horizons, refit_every, period, step_minutes, settings
    )
    targets = values[origins[:, None] + horizons[None, :]]
    calibration = first.calibration
    tracked = track(
        (targets - point) / scale,
        calibration.lower,
        calibration.upper,
        horizons,
        rate=settings.online_rate,
        width=calibration.step_width,
    )
    low = np.minimum(point + tracked.lower_used * scale, point)
    high = np.maximum(point + tracked.upper_used * scale, point)
    if settings.clip_at_zero:
        low = np.maximum(low, 0.0)
    return _result(
        values,
        origins,
        horizons,
        (period, step_minutes),
        targets,
        (low, point, high),
        first,
        names,
        fit_points,
    )


def _rolling_points(
    values: np.ndarray,
    origins: np.ndarray,
    horizons: np.ndarray,
    refit_every: int,
    period: int,
    step_minutes: int,
    settings: ForecastSettings,
) -> tuple[np.ndarray, np.ndarray, FittedGroup, list[str]]:
    """Point forecasts and interval scales per origin, refitting on data up to each block."""
    whole = Series(values, period)
    points, scales, names, first, last = [], [], [], None, None
    for start in range(0, origins.size, refit_every):
        block = origins[start : start + refit_every]
        # The live loop fits on at most `max_history_points`; so does each refit here.
        window = values[max(0, block[0] + 1 - settings.max_history_points) : block[0] + 1]
        # A constant window (an idle spell) has nothing to calibrate on: it keeps the last
        # refit's calibration; with none yet, the series cannot be judged (one clear line).
        try:
            group = fit_group(
                Series(window, period),
                horizons,
                settings,
                None if last is None else last.calibration,
                step_minutes=step_minutes,
            )
        except ValueError:
            raise ForecastInputError(
                f"demand is constant over the {window.size} points before origin {block[0]}: "
                "nothing to calibrate intervals on"
            ) from None
        first, last = first or group, group
        names.append(group.model_name)
        point = group.model.predict(whole, block, horizons)
        points.append(np.maximum(point, 0.0) if settings.clip_at_zero else point)
        scales.append(group.calibration.scale(whole, block)[:, None])
    return np.vstack(points), np.vstack(scales), first, names


def daily_tie_floor(residuals: np.ndarray, period: int) -> float | None:
    """online.tie_floor within every whole day, averaged over days: the least coverage of an
    interval that contains the median and lets each side miss at most its 10% of each day's
    targets. On a lumpy series (quiet days with fewer than 10% of moves on a side) coverage
    cannot fall to 0.8 without letting busy days' sides miss more than 10%; None when the
    window is shorter than a day."""
    days = residuals.size // period
    if days == 0:
        return None
    daily = residuals[: days * period].reshape(days, period)
    return float(np.mean(tie_floor(daily.T)))


def _result(
    values: np.ndarray,
    origins: np.ndarray,
    horizons: np.ndarray,
    steps: tuple[int, int],
    targets: np.ndarray,
    bands: tuple[np.ndarray, np.ndarray, np.ndarray],
    first: FittedGroup,
    names: list[str],
    fit_points: int,
) -> BacktestResult:
    (period, step_minutes), (low, mid, high) = steps, bands
    horizon_steps = int(horizons[-1])
    last = horizon_steps - 1
    target = targets[:, last]
    inside = (targets >= low) & (targets <= high)
    seasonal_ok = origins + horizon_steps - period >= 0
    seasonal = values[np.maximum(origins + horizon_steps - period, 0)]
    daily = [float(inside[k : k + period, last].mean()) for k in range(0, origins.size - period + 1, period)]
    counts = {name: names.count(name) for name in sorted(set(names))}
    return BacktestResult(
        mae=float(np.mean(np.abs(target - mid[:, last]))),
        persistence_mae=float(np.mean(np.abs(target - values[origins]))),
        seasonal_naive_mae=(float(np.mean(np.abs(target - seasonal))) if seasonal_ok.all() else None),
        coverage_80=float(np.mean(inside[:, last])),
        pinball_loss=float(
            np.mean(
                [
                    pinball(target, low[:, last], LOWER_QUANTILE),
                    pinball(target, mid[:, last], 0.5),
                    pinball(target, high[:, last], UPPER_QUANTILE),
                ]
            )
        ),
        chosen_model=max(counts, key=lambda name: (counts[name], name == names[-1])),
        origins=int(origins.size),
        horizon_steps=horizon_steps,
        step_minutes=step_minutes,
        points=int(values.size),
        fit_points=fit_points,
        mae_mean_over_steps=float(np.mean(np.abs(targets - mid))),
        persistence_mae_mean_over_steps=float(np.mean(np.abs(targets - values[origins][:, None]))),
        coverage_80_mean_over_steps=float(np.mean(inside)),
        interval_width_mean=float(np.mean(high[:, last] - low[:, last])),
        validation_mae_by_model={
            name: float(score.mae_by_horizon[-1]) for name, score in first.scores.items()
        },
        selection_note=first.note,
        refits=len(names),
        chosen_models=counts,
        coverage_80_daily_min=min(daily) if daily else None,
        coverage_80_daily_max=max(daily) if daily else None,
        tie_share=float(np.mean(target == mid[:, last])),
        coverage_80_tie_floor=daily_tie_floor(target - mid[:, last], period),
    )
