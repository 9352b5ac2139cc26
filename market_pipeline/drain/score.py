"""Drainability score of a running task (task drainability at the node level: which running
task can be moved off a node at the least cost to its tenant).

The score says how safely a task can be evicted, in [0, 1]:
- responsiveness: how it answered past drain signals (terminated in time vs needed
  SIGKILL vs failed), a Laplace-smoothed rate so a task without history scores 0.5;
- readiness: declared kind and checkpoint support (a checkpointing trainer loses little,
  a stateless inference replica can be re-routed, a trainer without checkpoints loses all);
- idleness: how little of its GPU request it uses (SM utilisation against the request);
- drainable class: the tenant bought the discounted drainable class and agreed to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from market_pipeline.hardware.protocol import ResourceClass, TaskInfo, TaskKind

SCORE_WEIGHTS: Mapping[str, float] = {
    "responsiveness": 0.35,
    "readiness": 0.35,
    "idleness": 0.20,
    "drainable_class": 0.10,
}
READINESS = {
    (TaskKind.TRAINING, True): 1.0,
    (TaskKind.INFERENCE, True): 0.8,
    (TaskKind.INFERENCE, False): 0.7,
    (TaskKind.TRAINING, False): 0.1,
}


@dataclass(frozen=True)
class DrainHistory:
    """Past drain outcomes of one task (or of its tenant, when the task has none)."""

    answered: int = 0  # exited after SIGTERM within the grace
    ignored: int = 0  # needed SIGKILL
    failed: int = 0  # the drain failed

    @property
    def total(self) -> int:
        return self.answered + self.ignored + self.failed

    def responsiveness(self) -> float:
        return (self.answered + 1.0) / (self.total + 2.0)


@dataclass(frozen=True)
class UtilisationStats:
    """A task's SM utilisation over a window, as percent of what it requested."""

    task_id: str
    mean_pct: float
    max_pct: float
    span_seconds: float  # from the first to the last sample in the window
    samples: int  # distinct sample timestamps


@dataclass(frozen=True)
class DrainabilityScore:
    task_id: str
    score: float
    responsiveness: float
    readiness: float
    idleness: float
    drainable_class: float

    def components(self) -> dict[str, float]:
        return {
            "responsiveness": round(self.responsiveness, 4),
            "readiness": round(self.readiness, 4),
            "idleness": round(self.idleness, 4),
            "drainable_class": self.drainable_class,
        }


def task_utilisation(
    samples: pl.DataFrame, tasks: Iterable[TaskInfo], now: datetime, window_minutes: float
) -> dict[str, UtilisationStats]:
    """Per task: SM utilisation relative to its request over [now - window, now]."""
    share = {t.task_id: max(t.gpu_milli, 1) / 1000.0 for t in tasks}
    missing = {"ts", "sm_util_pct", "task_id"} - set(samples.columns)
    if missing:
        raise ValueError(f"samples lack column(s) {sorted(missing)} needed for utilisation")
    if samples.is_empty() or not share:
        return {}
    # Integer epoch bounds: comparing against datetime literals costs more than the query.
    lo = int((now - timedelta(minutes=window_minutes)).timestamp() * 1_000_000)
    hi = int(now.timestamp() * 1_000_000)
    per_ts = (
        samples.lazy()
        .filter(
            pl.col("ts").dt.epoch("us").is_between(lo, hi)
            & pl.col("task_id").is_in(list(share))
            & pl.col("sm_util_pct").is_not_null()
        )
        .group_by("task_id", "ts")
        .agg(pl.col("sm_util_pct").mean().alias("util"))
        .group_by("task_id")
        .agg(
            pl.col("util").mean().alias("mean"),
            pl.col("util").max().alias("max"),
            ((pl.col("ts").max() - pl.col("ts").min()).dt.total_milliseconds() / 1000.0).alias("span"),
            pl.len().alias("n"),
        )
        .collect()
    )
    stats = {}
    for row in per_ts.iter_rows(named=True):
        scale = 1.0 / share[row["task_id"]]
        stats[row["task_id"]] = UtilisationStats(
            task_id=row["task_id"],
            mean_pct=min(100.0, row["mean"] * scale),
            max_pct=min(100.0, row["max"] * scale),
            span_seconds=float(row["span"]),
            samples=int(row["n"]),
        )
    return stats


def is_under_used(
    stats: UtilisationStats | None,
    threshold_pct: float,
    window_minutes: float,
    sample_interval_seconds: float,
) -> bool:
    """Below the threshold at every sample, over (nearly) the whole window."""
    if stats is None or stats.samples < 2:
        return False
    needed_span = window_minutes * 60.0 - 1.5 * sample_interval_seconds
    return stats.span_seconds >= max(needed_span, 0.0) and stats.max_pct < threshold_pct


def drainability_score(
    task: TaskInfo, utilisation: UtilisationStats | None, history: DrainHistory | None
) -> DrainabilityScore:
    responsiveness = (history or DrainHistory()).responsiveness()
    readiness = READINESS[(task.kind, task.checkpointable)]
    idleness = 0.5 if utilisation is None else 1.0 - min(utilisation.mean_pct, 100.0) / 100.0
    drainable = 1.0 if task.resource_class is ResourceClass.DRAINABLE else 0.0
    score = (
        SCORE_WEIGHTS["responsiveness"] * responsiveness
        + SCORE_WEIGHTS["readiness"] * readiness
        + SCORE_WEIGHTS["idleness"] * idleness
        + SCORE_WEIGHTS["drainable_class"] * drainable
    )
    return DrainabilityScore(task.task_id, round(score, 6), responsiveness, readiness, idleness, drainable)


def history_for(
    task: TaskInfo, by_task: Mapping[str, DrainHistory], by_tenant: Mapping[str, DrainHistory]
) -> DrainHistory | None:
    """The task's own record, else its tenant's (a fresh task inherits its owner's habits)."""
    own = by_task.get(task.task_id)
    if own is not None and own.total:
        return own
    return by_tenant.get(task.tenant_id)


def candidate_order(tasks: Iterable[TaskInfo], scores: Mapping[str, DrainabilityScore]) -> list[TaskInfo]:
    """Lowest priority first, then the most drainable, then task id (deterministic)."""
    return sorted(tasks, key=lambda t: (t.priority, -scores[t.task_id].score, t.task_id))
