"""Typed settings of the demand forecaster, validated at construction."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Bumped whenever a change alters what the forecaster outputs for the same input, so every
# stored forecast names the code that produced it (together with the settings hash).
FORECASTER_VERSION = "1.2.1"

KNOWN_LEARNED_MODELS = ("ridge", "gbm", "survival")
# The stored columns are named q10/q50/q90, so the interval levels are fixed, not settings.
LOWER_QUANTILE = 0.1
UPPER_QUANTILE = 0.9


class ForecastInputError(ValueError):
    """Input to the forecaster is malformed; the message names the field and the problem."""


class ForecastSettingsError(ValueError):
    """A forecast setting is invalid; the message names the setting."""


@dataclass(frozen=True)
class ForecastSettings:
    """Knobs of candidate fitting, model choice, calibration and fallback.

    Defaults were chosen by measurement: interval scaling and the choice guard on the Helios
    Earth traces (`forecast backtest`), the learned model on seeded synthetic demand.
    """

    period_minutes: int = 1440  # one day: seasonal naive lag and calendar phase
    coarse_step_minutes: int = 60  # the coarse curve is hourly ...
    coarse_points: int = 24  # ... for 24 hours
    learned_models: tuple[str, ...] = ("ridge", "survival")
    # Ridge and GBM on lags and calendar only (no varying price) won validation and then lost
    # to persistence out of sample on every real trace tried (first half of each Helios month,
    # an openb demand series: 0.1-4% worse at 1 h and 4 h), so by default they are candidates
    # only where the pool's price varies, which is where their gain was measured.
    learned_need_price: bool = True
    ridge_alpha: float = 0.05  # ridge penalty per training row on standardised features
    gbm_max_iter: int = 60
    gbm_learning_rate: float = 0.05
    validation_folds: int = 3
    validation_fraction: float = 0.3  # tail share of the fit window used for rolling-origin folds
    # A challenger replaces persistence only if it beats it by this relative margin on the
    # pooled validation error: persistence is hard to beat and a tie is not worth the risk.
    choice_margin: float = 0.02
    # ... and only if the gain is statistically clear: Diebold-Mariano t of the per-origin
    # error reduction (Newey-West variance) at least this (1.64: one-sided 5%).
    choice_min_t: float = 1.64
    min_history_points: int = 36  # below this: persistence (or prior) fallback
    min_calibration_residuals: int = 30
    max_gap_steps: int = 6  # gaps up to this length are carried forward; longer ones cut history
    max_stale_steps: int = 12  # newest observation older than this: prior (if any) fallback
    max_history_points: int = 4032  # 14 days at 5 minutes: older points add cost, not skill
    # Interval width scales with recent volatility (mean |1-step change| over this window)
    # plus a floor of this share of the fit window's mean |1-step change| (normalised conformal).
    scale_window_steps: int = 12
    scale_floor_fraction: float = 1.0
    # Online conformal (online.py): step size as a share of each horizon's initial interval
    # width (0 disables tracking). A forecast replays the newest `online_window_rows`
    # calibration rows (1 day of the 5-minute path, 12 days of the hourly curve) and shows
    # operators the coverage over the newest `coverage_window_rows` of them. Rate chosen on
    # the first half of each Helios month only (see README).
    online_rate: float = 0.05
    online_window_rows: int = 288
    coverage_window_rows: int = 288
    # Survival + arrival candidate: the arrival-fed equilibrium level is the trailing mean
    # over this window (series mode, when no task list is passed).
    survival_level_window_steps: int = 288
    fallback_relative_spread: float = 0.1  # q10/q90 half-width at 1 h when history shows no spread
    default_prior: float = 0.0  # demand assumed for a pool with no observation and no prior
    clip_at_zero: bool = True  # demand is a GPU count

    def __post_init__(self) -> None:
        _require(self.period_minutes >= 2, "period_minutes", "must be >= 2")
        _require(self.coarse_step_minutes >= 1, "coarse_step_minutes", "must be >= 1")
        _require(self.coarse_points >= 1, "coarse_points", "must be >= 1")
        for name in self.learned_models:
            _require(
                name in KNOWN_LEARNED_MODELS,
                "learned_models",
                f"unknown model {name!r}; known: {', '.join(KNOWN_LEARNED_MODELS)}",
            )
        _require(self.ridge_alpha >= 0.0, "ridge_alpha", "must be >= 0")
        _require(self.gbm_max_iter >= 1, "gbm_max_iter", "must be >= 1")
        _require(self.gbm_learning_rate > 0.0, "gbm_learning_rate", "must be > 0")
        _require(self.validation_folds >= 1, "validation_folds", "must be >= 1")
        _require(0.0 < self.validation_fraction < 1.0, "validation_fraction", "must be in (0, 1)")
        _require(0.0 <= self.choice_margin < 1.0, "choice_margin", "must be in [0, 1)")
        _require(self.choice_min_t >= 0.0, "choice_min_t", "must be >= 0")
        _require(self.min_history_points >= 2, "min_history_points", "must be >= 2")
        _require(self.min_calibration_residuals >= 5, "min_calibration_residuals", "must be >= 5")
        _require(self.max_gap_steps >= 0, "max_gap_steps", "must be >= 0")
        _require(self.max_stale_steps >= 0, "max_stale_steps", "must be >= 0")
        _require(
            self.max_history_points >= self.min_history_points,
            "max_history_points",
            "must be >= min_history_points",
        )
        _require(
            self.min_history_points > self.min_calibration_residuals,
            "min_history_points",
            "must exceed min_calibration_residuals (intervals need that many 1-step changes)",
        )
        _require(self.scale_window_steps >= 1, "scale_window_steps", "must be >= 1")
        _require(self.scale_floor_fraction > 0.0, "scale_floor_fraction", "must be > 0")
        _require(self.online_rate >= 0.0, "online_rate", "must be >= 0")
        _require(self.online_window_rows >= 1, "online_window_rows", "must be >= 1")
        _require(self.coverage_window_rows >= 1, "coverage_window_rows", "must be >= 1")
        _require(self.survival_level_window_steps >= 2, "survival_level_window_steps", "must be >= 2")
        _require(self.fallback_relative_spread >= 0.0, "fallback_relative_spread", "must be >= 0")
        _require(self.default_prior >= 0.0, "default_prior", "must be >= 0")

    def steps(self, step_minutes: int) -> tuple[int, int]:
        """(period, coarse step) in series steps of `step_minutes` minutes."""
        if step_minutes < 1:
            raise ForecastInputError(f"step_minutes must be >= 1, got {step_minutes}")
        for name, minutes in (
            ("period_minutes", self.period_minutes),
            ("coarse_step_minutes", self.coarse_step_minutes),
        ):
            if minutes % step_minutes:
                raise ForecastInputError(
                    f"step_minutes={step_minutes} does not divide forecast setting {name}={minutes}"
                )
        return self.period_minutes // step_minutes, self.coarse_step_minutes // step_minutes

    def fingerprint(self) -> str:
        return _fingerprint(self)

    def model_version(self) -> str:
        """Code version plus settings hash: two forecasts with equal versions are reproducible."""
        return f"{FORECASTER_VERSION}+{self.fingerprint()}"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ForecastSettings:
        """Build from a config section; unknown keys are an error, not silently ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ForecastSettingsError(f"unknown forecast setting(s): {', '.join(unknown)}")
        converted = dict(values)
        if "learned_models" in converted:
            converted["learned_models"] = tuple(converted["learned_models"])
        try:
            return cls(**converted)
        except TypeError as exc:
            raise ForecastSettingsError(f"invalid forecast settings: {exc}") from exc


@functools.lru_cache(maxsize=64)
def _fingerprint(settings: ForecastSettings) -> str:
    payload = json.dumps(dataclasses.asdict(settings), sort_keys=True, default=list)
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


def _require(condition: bool, name: str, problem: str) -> None:
    if not condition:
        raise ForecastSettingsError(f"forecast setting {name}: {problem}")


DEFAULT_SETTINGS = ForecastSettings()

__all__ = [
    "DEFAULT_SETTINGS",
    "FORECASTER_VERSION",
    "LOWER_QUANTILE",
    "UPPER_QUANTILE",
    "ForecastInputError",
    "ForecastSettings",
    "ForecastSettingsError",
]
