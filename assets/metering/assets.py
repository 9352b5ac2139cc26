"""Metering: per-second usage intervals per task, GPU and hour from the adapter's task
lifecycle events. In the billing group (billing_job selects it with the rest of billing); its
own job and schedule meter each hour as it closes.

Backfills run as one run per range (BackfillPolicy.single_run): metering loops over the hours.
"""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import dagster as dg
import polars as pl

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.partitions import HOURLY_PARTITIONS, SINGLE_RUN
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.billing.metering import HourWindow, gpu_seconds, metered_seconds
from market_pipeline.billing.metering_source import meter_partition

GROUP = "billing"  # billing_job selects the group (it bills what metering wrote)


@dg.asset(
    partitions_def=HOURLY_PARTITIONS,
    backfill_policy=SINGLE_RUN,
    group_name=GROUP,
    pool="warehouse",
    deps=[dg.AssetKey("fleet_adapter")],
    description="Per-second usage intervals per task, GPU and hour from the adapter's task "
    "lifecycle events (fractional/MIG shares as their fraction, memory per GPU).",
)
def usage_intervals(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, fleet: FleetAdapterResource
) -> dg.MaterializeResult:
    store = warehouse.get()
    adapter = fleet.get()
    config = fleet.config()
    frames = []
    for key in context.partition_keys:
        metered = meter_partition(adapter, store, config, HourWindow.from_partition_key(key))
        frames.append(metered.intervals)
    intervals = pl.concat(frames) if frames else pl.DataFrame()
    by_tenant = (
        intervals.group_by("tenant_id")
        .agg(pl.len().alias("intervals"), pl.col("task_id").n_unique().alias("tasks"))
        .sort("tenant_id")
        if intervals.height
        else pl.DataFrame()
    )
    return dg.MaterializeResult(
        metadata={
            ROW_COUNT: intervals.height,
            "partitions": len(context.partition_keys),
            "intervals": intervals.height,
            "metered_seconds": metered_seconds(intervals),
            "gpu_seconds": float(gpu_seconds(intervals)) if intervals.height else 0.0,
            "drained_or_failed": int(
                intervals.filter(pl.col("end_reason").is_in(["drained", "failed"])).height
            )
            if intervals.height
            else 0,
            "by_tenant": table_metadata(by_tenant),
        }
    )


metering_assets = [usage_intervals]
