"""Billing assets: the rate card, the ledger and the budget guards; the metered usage
intervals (hourly) they bill are metering's (assets/metering/assets.py, in this group), the dbt
billing marts between them are dbt.py. The billing job and its schedules are jobs.py and
schedules.py beside this file.

Every writing step takes the `warehouse` pool. Partitions are the shared hourly ones.
Backfills run as one run per range (BackfillPolicy.single_run): metering loops over the
hours, dbt rebuilds the whole range's window at once.
"""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import datetime as dt

import dagster as dg
import polars as pl

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.partitions import HOURLY_PARTITIONS, SINGLE_RUN
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.billing.balances import post_invoice_window
from market_pipeline.billing.guards import refused_tenants, run_budget_guards
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.warehouse.readers import tenant_balances

GROUP = "billing"  # with the dbt models (dbt.py) and usage_intervals: billing_job selects the group
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
    billing_ledger,
    budget_guard,
]  # and billing_dbt_models()
