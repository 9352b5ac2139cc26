"""The data-quality checks of one telemetry partition (telemetry_samples, assets.py): the
quarantine rate against its two thresholds, the ledger's accounting, the clean rows' rules, and
freshness."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import warnings
from collections.abc import Callable
from datetime import timedelta

import dagster as dg

from assets.lib.partitions import HOURLY_PARTITIONS
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.telemetry.assets import reasons_table, telemetry_samples
from market_pipeline.config import TelemetryConfig
from market_pipeline.hardware.protocol import adapter_now, unmeasured_fields
from market_pipeline.telemetry.checks import (
    accounting,
    clean_rules,
    freshness,
    quarantine_rate_verdict,
    quarantine_stats,
)

# Partitioned asset checks are a Dagster preview feature; they are what lets each check judge
# exactly the partition that was materialised, so the preview warning is expected here.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)


def _stats_metadata(stats) -> dict[str, object]:
    return {
        "rows_in": stats.rows_in,
        "clean": stats.clean,
        "quarantined": stats.quarantined,
        "quarantine_rate": dg.MetadataValue.float(stats.rate),
        "quarantine_reasons": reasons_table(stats.by_reason),
    }


def _quarantine_rate_check(
    name: str, rate: Callable[[TelemetryConfig], float], severity: dg.AssetCheckSeverity, description: str
) -> dg.AssetChecksDefinition:
    """The quarantine-rate check at the threshold `rate` reads from the config: an ERROR check
    blocks the partition's downstream assets, a WARN check only warns."""

    @dg.asset_check(
        name=name,
        asset=telemetry_samples,
        partitions_def=HOURLY_PARTITIONS,
        blocking=severity is dg.AssetCheckSeverity.ERROR,
        description=description,
    )
    def check(
        context: dg.AssetCheckExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
    ) -> dg.AssetCheckResult:
        threshold = rate(fleet.config().telemetry)
        verdict = quarantine_rate_verdict(
            quarantine_stats(warehouse.reader(), context.partition_key), threshold
        )
        return dg.AssetCheckResult(
            passed=verdict.passed,
            severity=severity,
            description=verdict.description,
            metadata={"threshold": dg.MetadataValue.float(threshold), **_stats_metadata(verdict.stats)},
        )

    return check


telemetry_quarantine_rate_blocking = _quarantine_rate_check(
    "telemetry_quarantine_rate_blocking",
    lambda telemetry: telemetry.quarantine_block_rate,
    dg.AssetCheckSeverity.ERROR,
    "Fails the partition when its quarantine rate passes telemetry.quarantine_block_rate.",
)
telemetry_quarantine_rate_warning = _quarantine_rate_check(
    "telemetry_quarantine_rate_warning",
    lambda telemetry: telemetry.quarantine_warn_rate,
    dg.AssetCheckSeverity.WARN,
    "Warns when the quarantine rate passes telemetry.quarantine_warn_rate.",
)


@dg.asset_check(
    asset=telemetry_samples,
    partitions_def=HOURLY_PARTITIONS,
    blocking=True,
    description="raw = clean + quarantined: the ledger's rows in equal the rows "
    "stored in the clean and quarantine tables.",
)
def telemetry_accounting(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    result = accounting(warehouse.reader(), context.partition_key)
    return dg.AssetCheckResult(
        passed=result.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{result.rows_in} rows in; {result.clean_rows} clean + "
            f"{result.quarantined_rows} quarantined stored"
        ),
        metadata={
            "rows_in": result.rows_in,
            "clean": result.clean_rows,
            "quarantined": result.quarantined_rows,
        },
    )


@dg.asset_check(
    asset=telemetry_samples,
    partitions_def=HOURLY_PARTITIONS,
    blocking=True,
    description="great-expectations rules on the clean rows: ranges, non-null keys, "
    "unique (node, GPU, ts), no future timestamps, known GPUs.",
)
def telemetry_clean_rules(
    context: dg.AssetCheckExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    adapter = fleet.get()
    report = clean_rules(
        warehouse.reader(),
        context.partition_key,
        fleet.config().telemetry,
        adapter_now(adapter),
        unmeasured_fields(adapter),
    )
    failed = ", ".join(f"{r.expectation}({r.column})" for r in report.failed)
    return dg.AssetCheckResult(
        passed=report.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(report.rules)} rules on {report.rows} clean rows"
        + (f"; failed: {failed}" if failed else ""),
        metadata={
            "rules": dg.MetadataValue.md(report.markdown()),
            "rows": report.rows,
            "seconds": dg.MetadataValue.float(round(report.seconds, 3)),
        },
    )


@dg.asset_check(
    asset=telemetry_samples,
    partitions_def=HOURLY_PARTITIONS,
    description="The newest clean sample is at most telemetry.freshness_minutes old.",
)
def telemetry_freshness(
    context: dg.AssetCheckExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    config = fleet.config().telemetry
    result = freshness(
        warehouse.reader(), adapter_now(fleet.get()), timedelta(minutes=config.freshness_minutes)
    )
    age = result.age
    return dg.AssetCheckResult(
        passed=result.passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=result.description,
        metadata={
            "latest_partition": result.latest_partition or "",
            "age_minutes": dg.MetadataValue.float(
                round(age.total_seconds() / 60, 2) if age is not None else -1.0
            ),
        },
    )


telemetry_checks = [
    telemetry_quarantine_rate_blocking,
    telemetry_quarantine_rate_warning,
    telemetry_accounting,
    telemetry_clean_rules,
    telemetry_freshness,
]
