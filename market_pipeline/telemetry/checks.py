"""Partition-level data-quality checks as plain functions returning typed verdicts.

The Dagster asset checks are thin wrappers around these: quarantine rate (blocking above
the block threshold, a warning above the warn threshold), raw = clean + quarantined
accounting, the great-expectations rules on the clean rows, and freshness.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from market_pipeline.telemetry.gx_rules import RuleLimits, RulesReport, run_clean_rules
from market_pipeline.telemetry.ingest import known_gpu_uuids
from market_pipeline.telemetry.schema import SAMPLE_COLUMNS
from market_pipeline.warehouse import Warehouse, telemetry_store


@dataclass(frozen=True)
class QuarantineStats:
    partition_key: str
    rows_in: int
    clean: int
    quarantined: int
    by_reason: dict[str, int]
    sources: tuple[str, ...]

    @property
    def rate(self) -> float:
        return self.quarantined / self.rows_in if self.rows_in else 0.0

    @property
    def ingested(self) -> bool:
        return bool(self.sources)


@dataclass(frozen=True)
class RateVerdict:
    passed: bool
    rate: float
    threshold: float
    stats: QuarantineStats

    @property
    def description(self) -> str:
        if not self.stats.ingested:
            return f"partition {self.stats.partition_key} has not been ingested"
        relation = "<=" if self.passed else ">"
        return (
            f"{self.stats.quarantined} of {self.stats.rows_in} rows quarantined "
            f"({self.rate:.3%} {relation} {self.threshold:.3%})"
        )


@dataclass(frozen=True)
class Accounting:
    partition_key: str
    rows_in: int  # what the ledger says the sources delivered
    clean_rows: int  # what the clean table holds
    quarantined_rows: int  # what the quarantine table holds

    @property
    def passed(self) -> bool:
        return self.rows_in == self.clean_rows + self.quarantined_rows


@dataclass(frozen=True)
class Freshness:
    latest_ts: datetime | None
    latest_partition: str | None
    now: datetime
    max_age: timedelta

    @property
    def age(self) -> timedelta | None:
        return None if self.latest_ts is None else self.now - self.latest_ts

    @property
    def passed(self) -> bool:
        return self.age is not None and self.age <= self.max_age

    @property
    def description(self) -> str:
        if self.latest_ts is None:
            return "no clean telemetry at all"
        minutes = self.age.total_seconds() / 60
        return (
            f"latest clean sample {self.latest_ts.isoformat()} (partition "
            f"{self.latest_partition}) is {minutes:.1f} min old; allowed "
            f"{self.max_age.total_seconds() / 60:.1f} min"
        )


def quarantine_stats(warehouse: Warehouse, partition_key: str) -> QuarantineStats:
    ledger = telemetry_store.ingest_ledger(warehouse, partition_key)
    by_reason: dict[str, int] = {}
    for raw in ledger.get_column("by_reason").to_list():
        for reason, count in json.loads(raw).items():
            by_reason[reason] = by_reason.get(reason, 0) + int(count)
    return QuarantineStats(
        partition_key=partition_key,
        rows_in=int(ledger.get_column("rows_in").sum()),
        clean=int(ledger.get_column("clean").sum()),
        quarantined=int(ledger.get_column("quarantined").sum()),
        by_reason=dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
        sources=tuple(ledger.get_column("source").to_list()),
    )


def quarantine_rate_verdict(stats: QuarantineStats, threshold: float) -> RateVerdict:
    """Passes when the partition was ingested and its quarantine rate is within threshold."""
    return RateVerdict(
        passed=stats.ingested and stats.rate <= threshold, rate=stats.rate, threshold=threshold, stats=stats
    )


def accounting(warehouse: Warehouse, partition_key: str) -> Accounting:
    return Accounting(partition_key, *telemetry_store.partition_counts(warehouse, partition_key))


def freshness(warehouse: Warehouse, now: datetime, max_age: timedelta) -> Freshness:
    latest_ts, latest_partition = telemetry_store.latest_clean(warehouse)
    return Freshness(latest_ts=latest_ts, latest_partition=latest_partition, now=now, max_age=max_age)


def clean_partition(warehouse: Warehouse, partition_key: str) -> pl.DataFrame:
    return telemetry_store.clean_rows(warehouse, partition_key, SAMPLE_COLUMNS)


def clean_rules(
    warehouse: Warehouse,
    partition_key: str,
    telemetry: object,
    now: datetime,
    unmeasured: frozenset[str] = frozenset(),
) -> RulesReport:
    """The great-expectations suite on one partition's clean rows; `unmeasured`: the fields
    the source declared it cannot measure (null allowed there)."""
    limits = RuleLimits(
        now=now,
        clock_skew=timedelta(seconds=float(getattr(telemetry, "clock_skew_seconds"))),
        temp_min_c=float(getattr(telemetry, "temp_min_c")),
        temp_max_c=float(getattr(telemetry, "temp_max_c")),
        known_gpu_uuids=known_gpu_uuids(warehouse) or None,
        unmeasured=unmeasured,
    )
    return run_clean_rules(clean_partition(warehouse, partition_key), limits)


def reasons_markdown(by_reason: dict[str, int]) -> str:
    """Quarantine reasons by count, most frequent first (a row may have several reasons)."""
    if not by_reason:
        return "_no quarantined rows_"
    ordered = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return "| reason | rows |\n|---|---|\n" + "\n".join(f"| {r} | {n} |" for r, n in ordered)


@dataclass(frozen=True)
class PartitionChecks:
    """Every partition check at once (the CLI and the benchmark; Dagster runs them apart)."""

    stats: QuarantineStats
    block: RateVerdict
    warn: RateVerdict
    accounting: Accounting
    rules: RulesReport
    freshness: Freshness

    @property
    def passed(self) -> bool:
        """The blocking checks: quarantine rate under the block threshold, accounting, rules."""
        return self.block.passed and self.accounting.passed and self.rules.passed

    def summary(self) -> dict[str, object]:
        return {
            "partition": self.stats.partition_key,
            "passed": self.passed,
            "rows_in": self.stats.rows_in,
            "clean": self.stats.clean,
            "quarantined": self.stats.quarantined,
            "quarantine_rate": self.stats.rate,
            "quarantine_block": {"passed": self.block.passed, "threshold": self.block.threshold},
            "quarantine_warn": {"passed": self.warn.passed, "threshold": self.warn.threshold},
            "accounting": {
                "passed": self.accounting.passed,
                "rows_in": self.accounting.rows_in,
                "clean": self.accounting.clean_rows,
                "quarantined": self.accounting.quarantined_rows,
            },
            "rules": {
                "passed": self.rules.passed,
                "rows": self.rules.rows,
                "seconds": round(self.rules.seconds, 3),
                "failed": [f"{r.expectation}({r.column})" for r in self.rules.failed],
            },
            "freshness": {"passed": self.freshness.passed, "description": self.freshness.description},
            "by_reason": self.stats.by_reason,
        }


def evaluate_partition(
    warehouse: Warehouse, partition_key: str, telemetry: object, now: datetime
) -> PartitionChecks:
    stats = quarantine_stats(warehouse, partition_key)
    return PartitionChecks(
        stats=stats,
        block=quarantine_rate_verdict(stats, float(getattr(telemetry, "quarantine_block_rate"))),
        warn=quarantine_rate_verdict(stats, float(getattr(telemetry, "quarantine_warn_rate"))),
        accounting=accounting(warehouse, partition_key),
        rules=clean_rules(warehouse, partition_key, telemetry, now),
        freshness=freshness(
            warehouse, now, timedelta(minutes=float(getattr(telemetry, "freshness_minutes")))
        ),
    )
