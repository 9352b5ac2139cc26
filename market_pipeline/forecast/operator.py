"""Operator view of the forecasts: rolling coverage and chosen model per pool, and the check.

Pure functions over `forecast_pool_results` output, so the `demand_forecast` asset only wraps
them: `operator_metadata(results)` returns plain values (a markdown table among them) for the
asset's metadata, `coverage_check(results)` a pass/fail with its reason for the asset check.

Rolling coverage is the share of the newest `coverage_window_rows` calibration origins whose
target fell inside the interval the online tracker had issued for them (1 h: the fine path's
last step; 4 h: the hourly curve's 4 h point). Next to it, the tie floor: the least coverage
those rows allow, since a target equal to the point is covered by every interval (a full or
idle pool reads ~1.0); the check's upper end rises with it, its lower end does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from market_pipeline.forecast.pool import PoolForecast
from market_pipeline.forecast.pools import PoolResult
from market_pipeline.forecast.settings import DEFAULT_SETTINGS, LOWER_QUANTILE, UPPER_QUANTILE

TARGET_COVERAGE = UPPER_QUANTILE - LOWER_QUANTILE
COVERAGE_LOW, COVERAGE_HIGH = 0.7, 0.9  # the check's band around the 0.8 target
CHECK_HORIZONS_MIN = (60, 240)
# The check judges a horizon only on at least this many independent targets, pooled over
# pools: consecutive origins' targets overlap, so a window of R rows holds R / (horizon in
# rows) of them. At 16 one standard error of an 80% coverage, sqrt(0.16 / n), is the band's
# half-width (0.1); a 6-hour-old pool has ~5 at 1 h, where two demand jumps move its
# coverage by 0.2 (derived from the band, not tuned).
MIN_INDEPENDENT_TARGETS = 16


@dataclass(frozen=True)
class TrackedHorizon:
    coverage: float  # rolling share of targets the issued intervals covered
    tie_floor: float  # the least coverage those rows allow (online.tie_floor)
    steps: int  # rows the tracker saw
    row_minutes: int  # minutes between rows


def _tracked(forecast: PoolForecast, minutes: int) -> TrackedHorizon | None:
    """The stored horizon `minutes`' rolling coverage, fine path first; None when not
    tracked there."""
    for horizons, coverage, floor, steps, row_minutes in (
        (
            forecast.horizon_minutes,
            forecast.recent_coverage,
            forecast.recent_tie_floor,
            forecast.online_steps,
            forecast.step_minutes,
        ),
        (
            forecast.coarse_horizon_minutes,
            forecast.coarse_recent_coverage,
            forecast.coarse_recent_tie_floor,
            forecast.coarse_online_steps,
            forecast.coarse_step_minutes,
        ),
    ):
        if coverage is None:
            continue
        hit = np.flatnonzero(horizons == minutes)
        if hit.size and np.isfinite(coverage[hit[0]]):
            tie = TARGET_COVERAGE if floor is None or not np.isfinite(floor[hit[0]]) else floor[hit[0]]
            return TrackedHorizon(float(coverage[hit[0]]), float(tie), steps, row_minutes)
    return None


def coverage_at(forecast: PoolForecast, minutes: int) -> float | None:
    """Rolling coverage of the stored horizon `minutes`, or None when not tracked there."""
    tracked = _tracked(forecast, minutes)
    return None if tracked is None else tracked.coverage


def tie_floor_at(forecast: PoolForecast, minutes: int) -> float | None:
    """The least coverage the rows behind `coverage_at` allow: 0.8 on a pool whose demand
    moves, up to 1.0 on one that is always full or idle; None when not tracked there."""
    tracked = _tracked(forecast, minutes)
    return None if tracked is None else tracked.tie_floor


def upper_band(tie_floor: float, high: float = COVERAGE_HIGH) -> float:
    """Coverage above which intervals are too wide: `high`, raised by as much as ties lift
    the floor over the target. Ties are covered by every interval that keeps the point, so
    a pool whose demand did not move 97% of the time reads 0.97 with nothing to narrow;
    only coverage more than (high - 0.8) above the floor is width the tracker could give
    back. Under-coverage (the capacity risk) is judged against `low` whatever the ties."""
    return max(high, tie_floor + high - TARGET_COVERAGE)


def independent_targets(forecast: PoolForecast, minutes: int, window_rows: int) -> float:
    """Non-overlapping targets behind `coverage_at(forecast, minutes)` (0 when not tracked):
    the rolling window's rows over the horizon in rows (fine rows are one step apart, the
    hourly curve's one coarse step)."""
    tracked = _tracked(forecast, minutes)
    if tracked is None:
        return 0.0
    return min(tracked.steps, window_rows) / max(minutes / tracked.row_minutes, 1.0)


def operator_rows(results: Sequence[PoolResult]) -> list[dict[str, object]]:
    """One row per pool: chosen models, how they were chosen, tracker steps, coverage."""
    rows = []
    for result in results:
        forecast = result.forecast
        row: dict[str, object] = {
            "pool_id": result.pool_id,
            "model": forecast.model,
            "chosen_by": forecast.chosen_by,
            "coarse_model": forecast.coarse_model,
            "online_steps": forecast.online_steps,
            "coarse_online_steps": forecast.coarse_online_steps,
        }
        for minutes in CHECK_HORIZONS_MIN:
            row[f"coverage_80_{minutes}m"] = coverage_at(forecast, minutes)
            row[f"tie_floor_80_{minutes}m"] = tie_floor_at(forecast, minutes)
        row["fallback_reason"] = forecast.fallback_reason
        rows.append(row)
    return rows


def markdown_table(rows: Sequence[dict[str, object]]) -> str:
    """A GitHub markdown table (no pandas/tabulate needed); floats to 3 decimals."""
    if not rows:
        return "_no pools_"
    columns = list(rows[0])

    def cell(value: object) -> str:
        if value is None:
            return ""
        return f"{value:.3f}" if isinstance(value, float) else str(value).replace("|", "/")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _pooled(results: Sequence[PoolResult], minutes: int) -> TrackedHorizon | None:
    """Mean coverage and mean tie floor over the pools tracked at `minutes`."""
    known = [t for t in (_tracked(r.forecast, minutes) for r in results) if t is not None]
    if not known:
        return None
    return TrackedHorizon(
        float(np.mean([t.coverage for t in known])),
        float(np.mean([t.tie_floor for t in known])),
        sum(t.steps for t in known),
        known[0].row_minutes,
    )


def operator_metadata(results: Sequence[PoolResult]) -> dict[str, object]:
    """Plain values for `demand_forecast`'s metadata (wrap the markdown in MetadataValue.md)."""
    rows = operator_rows(results)
    metadata: dict[str, object] = {
        "forecast_operator_table": markdown_table(rows),
        "models_chosen": dict(Counter(r.forecast.model for r in results)),
        "models_chosen_by": dict(Counter(r.forecast.chosen_by for r in results)),
    }
    for minutes in CHECK_HORIZONS_MIN:
        pooled = _pooled(results, minutes)
        if pooled is not None:  # Dagster metadata takes no None: absent means not tracked
            metadata[f"rolling_coverage_80_{minutes}m"] = pooled.coverage
            metadata[f"rolling_tie_floor_80_{minutes}m"] = pooled.tie_floor
    return metadata


@dataclass(frozen=True)
class CoverageCheck:
    passed: bool
    reason: str
    warnings: list[str] = field(default_factory=list)


def coverage_check(
    results: Sequence[PoolResult],
    *,
    low: float = COVERAGE_LOW,
    high: float = COVERAGE_HIGH,
    window_rows: int = DEFAULT_SETTINGS.coverage_window_rows,
) -> CoverageCheck:
    """Pass when the pools' mean rolling 80% coverage is within [low, high] at 1 h and 4 h,
    the upper end raised where ties lift the pools' floor (`upper_band`).

    One pool's day of coverage is noisy (a handful of demand jumps decide it), so the check is
    on the mean over pools and names the pools outside the band as warnings; a pool whose
    persistence forecast came from a fallback (no fit) is a warning too. A horizon with
    fewer than MIN_INDEPENDENT_TARGETS independent targets is not judged (and says so).
    """
    warnings = [
        f"{r.pool_id}: persistence by fallback ({r.forecast.fallback_reason})"
        for r in results
        if r.forecast.chosen_by == "fallback"
    ]
    failures, measured, untracked = [], [], []
    for minutes in CHECK_HORIZONS_MIN:
        pooled = _pooled(results, minutes)
        if pooled is None:
            untracked.append(f"{minutes} min")
            continue
        targets = sum(independent_targets(r.forecast, minutes, window_rows) for r in results)
        if targets < MIN_INDEPENDENT_TARGETS:
            untracked.append(
                f"{minutes} min ({pooled.coverage:.3f} on {targets:.0f} independent "
                f"targets, too few to judge; need {MIN_INDEPENDENT_TARGETS})"
            )
            continue
        top = upper_band(pooled.tie_floor, high)
        ties = f" (ties floor {pooled.tie_floor:.3f})" if top > high else ""
        measured.append(f"{minutes} min {pooled.coverage:.3f}{ties}")
        if not low <= pooled.coverage <= top:
            failures.append(
                f"rolling 80% coverage at {minutes} min is {pooled.coverage:.3f}, "
                f"outside [{low}, {top:.3f}]{ties}"
            )
        for r in results:
            tracked = _tracked(r.forecast, minutes)
            if tracked is not None and not low <= tracked.coverage <= upper_band(tracked.tie_floor, high):
                warnings.append(
                    f"{r.pool_id}: coverage {tracked.coverage:.3f} at {minutes} min "
                    f"(ties floor {tracked.tie_floor:.3f})"
                )
    if failures:
        return CoverageCheck(False, "; ".join(failures), warnings)
    if not measured:
        return CoverageCheck(
            True,
            "no pool has enough tracked coverage yet (fallbacks or "
            "short histories)" + "".join(f"; {u}" for u in untracked),
            warnings,
        )
    # A young pool (under a day of demand, as in the demo) has no hourly-curve residuals yet:
    # say which horizons the pass does not cover rather than let it read as all of them.
    note = f"; not judged yet: {', '.join(untracked)}" if untracked else ""
    return CoverageCheck(
        True,
        "rolling 80% coverage " + ", ".join(measured) + f" within [{low}, {high}] (above {high} only "
        "where ties raise the floor)" + note,
        warnings,
    )
