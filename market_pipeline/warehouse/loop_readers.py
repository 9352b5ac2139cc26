"""Typed readers of what a run of the control loop left in the warehouse (the demo's summary).

Each reader is one question about the loop's tables, answered as a dataclass or a list of
rows; windows are [start, end) for samples and usage, (start, end] for solves and decisions
(a tick's outputs carry the tick's end).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from market_pipeline.warehouse.store import Warehouse


def _scalar(store: Warehouse, sql: str, params: list | None = None):
    return store.query(sql, params or []).row(0)[0]


@dataclass(frozen=True)
class FleetCounts:
    nodes: int
    nodes_on: int
    gpus: int


def fleet_counts(store: Warehouse) -> FleetCounts:
    """The fleet's nodes (all, and those powered on) and GPUs."""
    return FleetCounts(
        nodes=_scalar(store, "SELECT count(*) FROM fleet_nodes"),
        nodes_on=_scalar(store, "SELECT count(*) FROM fleet_nodes WHERE state = 'on'"),
        gpus=_scalar(store, "SELECT count(*) FROM fleet_gpus"),
    )


@dataclass(frozen=True)
class TelemetryCounts:
    ingested: int  # rows the adapter delivered, every ingest
    quarantined: int  # of those, quarantined, every ingest
    clean_in_window: int  # clean samples in the window
    mean_sm_util_pct: float  # their mean SM utilisation (0 without samples)


def telemetry_counts(store: Warehouse, start: datetime, end: datetime) -> TelemetryCounts:
    """Samples ingested and quarantined (all ingests), and the clean ones in [start, end)."""
    window = [start, end]
    return TelemetryCounts(
        ingested=_scalar(store, "SELECT coalesce(sum(rows_in), 0) FROM telemetry_ingests"),
        quarantined=_scalar(store, "SELECT coalesce(sum(quarantined), 0) FROM telemetry_ingests"),
        clean_in_window=_scalar(
            store, "SELECT count(*) FROM telemetry_clean WHERE ts >= ? AND ts < ?", window
        ),
        mean_sm_util_pct=float(
            _scalar(
                store,
                "SELECT coalesce(avg(sm_util_pct), 0) FROM telemetry_clean WHERE ts >= ? AND ts < ?",
                window,
            )
        ),
    )


@dataclass(frozen=True)
class UsageInWindow:
    tasks_seen: int  # distinct tasks with usage overlapping the window
    gpu_hours: float  # GPU-hours of the usage intervals that started in the window


def usage_in_window(store: Warehouse, start: datetime, end: datetime) -> UsageInWindow:
    """The metered usage of [start, end)."""
    return UsageInWindow(
        tasks_seen=_scalar(
            store,
            "SELECT count(DISTINCT task_id) FROM usage_intervals WHERE started_at < ? AND ended_at > ?",
            [end, start],
        ),
        gpu_hours=float(
            _scalar(
                store,
                "SELECT coalesce(sum(epoch(ended_at - started_at) * gpu_fraction), 0) / 3600 FROM usage_intervals "
                "WHERE started_at >= ? AND started_at < ?",
                [start, end],
            )
        ),
    )


@dataclass(frozen=True)
class SolveCounts:
    solves: int
    converged: int


def solve_counts(store: Warehouse, start: datetime, end: datetime) -> SolveCounts:
    """The market solves of (start, end], and how many converged."""
    window = [start, end]
    return SolveCounts(
        solves=_scalar(
            store, "SELECT count(*) FROM solve_reports WHERE solved_at > ? AND solved_at <= ?", window
        ),
        converged=_scalar(
            store,
            "SELECT count(*) FROM solve_reports WHERE converged AND solved_at > ? AND solved_at <= ?",
            window,
        ),
    )


@dataclass(frozen=True)
class LatestPrice:
    pool_id: str
    resource_class: str
    price: float  # per GPU-hour, the latest effective


def latest_prices(store: Warehouse) -> list[LatestPrice]:
    """The price book's latest price per pool and class, ordered by pool and class."""
    frame = store.query(
        "SELECT pool_id, resource_class, CAST(arg_max(price_per_gpu_hour, effective_from) AS DOUBLE) AS price "
        "FROM price_book GROUP BY ALL ORDER BY ALL"
    )
    return [LatestPrice(**row) for row in frame.iter_rows(named=True)]


@dataclass(frozen=True)
class DecisionCount:
    kind: str
    action: str
    allowed: bool
    n: int


def decision_counts(store: Warehouse, start: datetime, end: datetime) -> list[DecisionCount]:
    """The decisions of (start, end] counted by kind, action and verdict, in that order."""
    frame = store.query(
        "SELECT kind, action, allowed, count(*) AS n FROM decisions WHERE decided_at > ? AND decided_at <= ? "
        "GROUP BY ALL ORDER BY ALL",
        [start, end],
    )
    return [DecisionCount(**row) for row in frame.iter_rows(named=True)]


@dataclass(frozen=True)
class DrainOutcomeCount:
    outcome: str
    n: int


def drain_outcome_counts(store: Warehouse) -> list[DrainOutcomeCount]:
    """The billed drains counted by outcome, in outcome order."""
    frame = store.query("SELECT outcome, count(*) AS n FROM drain_billing_events GROUP BY ALL ORDER BY ALL")
    return [DrainOutcomeCount(**row) for row in frame.iter_rows(named=True)]


def billed_cost_daily(store: Warehouse) -> Decimal:
    """The invoices' billed cost at the daily grain (fct_invoice_lines), all periods."""
    return _scalar(
        store, "SELECT coalesce(sum(billed_cost), 0) FROM fct_invoice_lines WHERE period_grain = 'day'"
    )


@dataclass(frozen=True)
class Reconciliation:
    """Every metered usage interval is rated, and its seconds with it (fct_rated_usage)."""

    usage_intervals: int
    rated_intervals: int
    unrated_intervals: int
    metered_seconds: int
    rated_seconds: int


def reconciliation(store: Warehouse) -> Reconciliation:
    """Usage intervals and their seconds against what fct_rated_usage rated."""
    usage = store.query(
        "SELECT count(*), coalesce(sum(epoch(ended_at - started_at)), 0)::BIGINT FROM usage_intervals"
    ).row(0)
    rated = store.query(
        "SELECT count(DISTINCT interval_id), coalesce(sum(metered_seconds), 0)::BIGINT FROM fct_rated_usage"
    ).row(0)
    unrated = _scalar(
        store,
        "SELECT count(*) FROM usage_intervals u WHERE NOT EXISTS "
        "(SELECT 1 FROM fct_rated_usage r WHERE r.interval_id = u.interval_id)",
    )
    return Reconciliation(
        usage_intervals=int(usage[0]),
        rated_intervals=int(rated[0]),
        unrated_intervals=int(unrated),
        metered_seconds=int(usage[1]),
        rated_seconds=int(rated[1]),
    )
