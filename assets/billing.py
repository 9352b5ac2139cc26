"""Billing assets: the rate card, metered usage intervals (hourly), the ledger and the budget
guards; the dbt billing marts between them are assets/billing_dbt.py. The billing job and its
schedules are sensors/jobs.py and sensors/schedules.py.

Every writing step takes the `warehouse` pool. Partitions are the shared hourly ones.
Backfills run as one run per range (BackfillPolicy.single_run): metering loops over the
hours, dbt rebuilds the whole range's window at once.
"""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import datetime as dt

import dagster as dg
import polars as pl

from assets.metadata import ROW_COUNT, table_metadata
from assets.partitions import HOURLY_PARTITIONS, SINGLE_RUN
from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.billing.balances import post_invoice_window
from market_pipeline.billing.guards import refused_tenants, run_budget_guards
from market_pipeline.billing.metering import HourWindow, gpu_seconds, metered_seconds
from market_pipeline.billing.metering_source import meter_partition
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.warehouse.readers import tenant_balances

GROUP = "billing"  # with the dbt models (assets/billing_dbt.py): billing_job selects the group
GUARD_FRESHNESS = dt.timedelta(hours=2)  # guards act on the present, not on backfilled hours


@dg.asset(
    group_name=GROUP,
    pool="warehouse",
    description="Billing rate card (time bands, zone coefficients, base prices, commitment "
    "tiers, grace and SLA terms, capacity cost per GPU model) refreshed from the "
    "typed config.",
)
def billing_rate_card(warehouse: WarehouseResource, fleet: FleetAdapterResource) -> dg.MaterializeResult:
    card = refresh_rate_card(warehouse.get(), fleet.config())
    terms = card.terms.row(0, named=True)
    return dg.MaterializeResult(
        metadata={
            "grace_seconds": terms["grace_seconds"],
            "sla_credit_rate": float(terms["sla_credit_rate"]),
            "zones": table_metadata(card.zones),
            "gpu_costs": table_metadata(card.gpu_costs),
            "commitment_tiers": table_metadata(card.tiers),
        }
    )


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


@dg.asset(
    partitions_def=HOURLY_PARTITIONS,
    backfill_policy=SINGLE_RUN,
    group_name=GROUP,
    pool="warehouse",
    deps=[dg.AssetKey("fct_invoice_lines")],
    description="Balances: hourly invoice lines posted to the tenant ledger (usage debits, "
    "SLA credits), replacing the window's postings (exactly once).",
)
def billing_ledger(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    window = context.partition_time_window
    store = warehouse.get()
    written = post_invoice_window(store, window.start, window.end)
    balances = tenant_balances(store)
    return dg.MaterializeResult(
        metadata={ROW_COUNT: written, "entries": written, "balances": table_metadata(balances)}
    )


@dg.asset(
    partitions_def=HOURLY_PARTITIONS,
    backfill_policy=SINGLE_RUN,
    group_name=GROUP,
    pool="warehouse",
    deps=[dg.AssetKey("billing_ledger")],
    description="Budget guards: guarded tenants whose balance cannot cover the next interval or "
    "whose spend passes a hard cap get new tasks refused and running tasks drained "
    "after the grace period (`budget_guard` decisions for the task-drain guardrail).",
)
def budget_guard(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, fleet: FleetAdapterResource
) -> dg.MaterializeResult:
    adapter = fleet.get()
    now = adapter_now(adapter)
    window = context.partition_time_window
    if window.end < now - GUARD_FRESHNESS:
        return dg.MaterializeResult(
            metadata={"skipped": f"historical window ending {window.end.isoformat()}"}
        )
    config = fleet.config()
    run = run_budget_guards(warehouse.get(), config, adapter.list_tasks(), now)
    refused = refused_tenants(run)
    admission = "not applied (shadow mode)" if config.loop.shadow_mode else "adapter cannot refuse tasks"
    # Only a fleet with an admission door (the simulated twin) takes the list; on others the
    # refusal stands in `decisions` for the scheduler in front of the fleet to read.
    set_refused = getattr(adapter, "set_refused_tenants", None)
    if set_refused is not None and not config.loop.shadow_mode:
        admission = set_refused(refused).detail
    table = (
        pl.DataFrame(
            [
                {
                    "tenant": v.tenant_id,
                    "admit": v.admit_new_tasks,
                    "balance": str(v.balance),
                    "next_interval": str(v.next_interval_cost),
                    "reasons": "; ".join(v.reasons),
                }
                for v in run.verdicts
            ]
        )
        if run.verdicts
        else pl.DataFrame()
    )
    return dg.MaterializeResult(
        metadata={
            "guarded_tenants": len(run.verdicts),
            "blocked_tenants": sum(1 for v in run.verdicts if not v.admit_new_tasks),
            "drain_decisions": int(run.decisions.filter(pl.col("action") == "drain").height),
            "admission": dg.MetadataValue.text(admission),
            "verdicts": table_metadata(table),
        }
    )


billing_assets = [
    billing_rate_card,
    usage_intervals,
    billing_ledger,
    budget_guard,
]  # and billing_dbt_models()
