"""Telemetry: hourly samples from the node hardware adapter, validated into the warehouse
(the partition's data-quality checks are in checks.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import dagster as dg

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.partitions import HOURLY_PARTITIONS
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.hardware.protocol import adapter_now, unmeasured_fields
from market_pipeline.report.plots import png_markdown
from market_pipeline.telemetry.checks import clean_partition
from market_pipeline.telemetry.heatmap import utilisation_heatmap_png
from market_pipeline.telemetry.ingest import ingest_samples, known_gpu_uuids
from market_pipeline.telemetry.partitions import partition_window
from market_pipeline.telemetry.rules import ValidationPolicy

ADAPTER_SOURCE = "adapter"  # the asset owns what the adapter delivered into a partition


@dg.asset(
    partitions_def=HOURLY_PARTITIONS,
    pool="warehouse",
    group_name="telemetry",
    deps=[dg.AssetKey("fleet_adapter")],
    kinds={"duckdb", "polars"},
)
def telemetry_samples(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """One hour of per-GPU samples: clean rows to telemetry_clean, rejected rows with their
    reasons to telemetry_quarantine, counts to telemetry_ingests. Re-running replaces it."""
    window = partition_window(context.partition_key)
    adapter = fleet.get()
    frame = adapter.read_samples(window.start, window.end)
    adapter_error = getattr(adapter, "last_error", None)
    if frame.is_empty() and adapter_error:
        raise dg.Failure(f"{adapter.backend} adapter could not read samples: {adapter_error}")
    store = warehouse.get()
    policy = ValidationPolicy.from_config(
        fleet.config().telemetry,
        now=adapter_now(adapter),
        window=window,
        known_gpu_uuids=known_gpu_uuids(store),
        unmeasured=unmeasured_fields(adapter),
    )
    report = ingest_samples(
        store, frame, source=ADAPTER_SOURCE, policy=policy, where=f"{adapter.backend} adapter samples"
    )
    context.log.info(
        "telemetry %s: %d in, %d clean, %d quarantined",
        window.key,
        report.rows_in,
        report.clean,
        report.quarantined,
    )
    metadata: dict[str, object] = {
        ROW_COUNT: report.clean,
        "rows_in": report.rows_in,
        "clean": report.clean,
        "quarantined": report.quarantined,
        "quarantine_rate": dg.MetadataValue.float(report.quarantine_rate),
        "quarantine_reasons": reasons_table(report.by_reason),
        "ingest_id": report.ingest_id,
        "backend": adapter.backend,
        "not_reported": dg.MetadataValue.text(", ".join(sorted(unmeasured_fields(adapter))) or "none"),
        "ingest_seconds": dg.MetadataValue.float(round(report.seconds, 3)),
    }
    png = utilisation_heatmap_png(
        clean_partition(store, window.key), title=f"SM utilisation (%) {window.key} UTC"
    )
    if png is not None:
        metadata["utilisation_heatmap"] = dg.MetadataValue.md(png_markdown(png, "SM utilisation"))
    return dg.MaterializeResult(metadata=metadata)


def reasons_table(by_reason: dict[str, int]) -> dg.TableMetadataValue:
    """Quarantine reasons by count, most frequent first (a row may have several reasons)."""
    ordered = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return table_metadata(
        [{"reason": r, "rows": n} for r, n in ordered] or [{"reason": "no quarantined rows", "rows": 0}]
    )


telemetry_assets = [telemetry_samples]
