"""Billing assets: the rate card, metered usage intervals (hourly), the dbt billing marts
(hourly windows, dbt tests as asset checks), the ledger and the budget guards; the
billing job and its hourly and daily schedules.

Every writing step takes the `warehouse` pool. Partitions are telemetry's hourly ones.
Backfills run as one run per range (BackfillPolicy.single_run): metering loops over the
hours, dbt rebuilds the whole range's window at once.
"""


import datetime as dt
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
    dbt_assets,
)

from assets.fleet import fleet_adapter
from assets.resources import FleetAdapterResource, WarehouseResource
from assets.telemetry import TELEMETRY_PARTITIONS
from assets.metadata import ROW_COUNT, table_metadata
from market_pipeline.billing.balances import post_invoice_window
from market_pipeline.billing.dbt_metadata import model_description, row_counts, dbt_test_description
from market_pipeline.billing.dbt_project import (
    DBT_PROJECT_DIR,
    UNIT_TESTS_EXCLUDED,
    WAREHOUSE_ENV,
    billing_vars,
    environment_overrides,
    ensure_manifest,
)
from market_pipeline.billing.guards import refused_tenants, run_budget_guards
from market_pipeline.billing.metering import HourWindow, gpu_seconds, metered_seconds
from market_pipeline.billing.metering_source import meter_partition
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.config import ConfigError, load_config
from market_pipeline.hardware.protocol import adapter_now
from sensors.schedules import default_status, hourly_partition_schedule, tick_tags

HOURLY_PARTITIONS = TELEMETRY_PARTITIONS
GROUP = "billing"
SINGLE_RUN = dg.BackfillPolicy.single_run()
GUARD_FRESHNESS = dt.timedelta(hours=2)  # guards act on the present, not on backfilled hours

DBT_PROJECT = DbtProject(project_dir=DBT_PROJECT_DIR, profiles_dir=DBT_PROJECT_DIR)
# dbt parse when the manifest is missing or older than the project (for the configured
# warehouse, so the runs' dbt subprocesses can reuse the partial parse)
def _configured_warehouse() -> Path | None:
    try:
        return load_config().warehouse_path
    except ConfigError:  # reported where the config is used; parsing does not need it
        return None


ensure_manifest(DBT_PROJECT_DIR, _configured_warehouse())


@dg.asset(group_name=GROUP, pool="warehouse",
          description="Billing rate card (time bands, zone coefficients, base prices, commitment "
                      "tiers, grace and SLA terms, capacity cost per GPU model) refreshed from the "
                      "typed config.")
def billing_rate_card(warehouse: WarehouseResource, fleet: FleetAdapterResource) -> dg.MaterializeResult:
    card = refresh_rate_card(warehouse.get(), fleet.config())
    terms = card.terms.row(0, named=True)
    return dg.MaterializeResult(metadata={
        "grace_seconds": terms["grace_seconds"], "sla_credit_rate": float(terms["sla_credit_rate"]),
        "zones": table_metadata(card.zones),
        "gpu_costs": table_metadata(card.gpu_costs),
        "commitment_tiers": table_metadata(card.tiers),
    })


@dg.asset(partitions_def=HOURLY_PARTITIONS, backfill_policy=SINGLE_RUN, group_name=GROUP, pool="warehouse",
          deps=[fleet_adapter],
          description="Per-second usage intervals per task, GPU and hour from the adapter's task "
                      "lifecycle events (fractional/MIG shares as their fraction, memory per GPU).")
def usage_intervals(context: dg.AssetExecutionContext, warehouse: WarehouseResource,
                    fleet: FleetAdapterResource) -> dg.MaterializeResult:
    store = warehouse.get()
    adapter = fleet.get()
    config = fleet.config()
    frames = []
    for key in context.partition_keys:
        metered = meter_partition(adapter, store, config, HourWindow.from_partition_key(key))
        frames.append(metered.intervals)
    intervals = pl.concat(frames) if frames else pl.DataFrame()
    by_tenant = (intervals.group_by("tenant_id").agg(pl.len().alias("intervals"),
                                                     pl.col("task_id").n_unique().alias("tasks"))
                 .sort("tenant_id") if intervals.height else pl.DataFrame())
    return dg.MaterializeResult(metadata={
        ROW_COUNT: intervals.height,
        "partitions": len(context.partition_keys),
        "intervals": intervals.height,
        "metered_seconds": metered_seconds(intervals),
        "gpu_seconds": float(gpu_seconds(intervals)) if intervals.height else 0.0,
        "drained_or_failed": int(intervals.filter(pl.col("end_reason").is_in(["drained", "failed"])).height)
        if intervals.height else 0,
        "by_tenant": table_metadata(by_tenant),
    })


class BillingDbtTranslator(DagsterDbtTranslator):
    def get_group_name(self, dbt_resource_props: dict[str, Any]) -> str | None:
        return GROUP

    def get_description(self, dbt_resource_props: Mapping[str, Any]) -> str:
        """The model's own description (dbt/models/**.yml), not its raw SQL."""
        return model_description(dbt_resource_props)

    def get_asset_check_spec(self, asset_spec: dg.AssetSpec, manifest: Mapping[str, Any], unique_id: str,
                             project: DbtProject | None) -> dg.AssetCheckSpec | None:
        spec = super().get_asset_check_spec(asset_spec, manifest, unique_id, project)
        if spec is None:
            return None
        node = manifest["nodes"].get(unique_id, {})
        return spec._replace(description=dbt_test_description(node))


BILLING_DBT_TRANSLATOR = BillingDbtTranslator(settings=DagsterDbtTranslatorSettings(
    enable_asset_checks=True, enable_duplicate_source_asset_keys=True))


@dbt_assets(manifest=DBT_PROJECT.manifest_path, project=DBT_PROJECT, partitions_def=HOURLY_PARTITIONS,
            backfill_policy=SINGLE_RUN, pool="warehouse", dagster_dbt_translator=BILLING_DBT_TRANSLATOR,
            name="billing_dbt_models")
def billing_dbt_models(context: dg.AssetExecutionContext, dbt: DbtCliResource,
                       warehouse: WarehouseResource, fleet: FleetAdapterResource) -> Iterator[Any]:
    """dbt build of the billing marts for the run's hours (window_table: the window's rows replaced
    at once), with the config's billing vars (idle-cost allocation)."""
    window = context.partition_time_window
    dbt_vars = billing_vars(fleet.config(), window.start, window.end)
    with environment_overrides({WAREHOUSE_ENV: str(Path(warehouse.path).resolve())}):
        invocation = dbt.cli(["build", *UNIT_TESTS_EXCLUDED, "--vars", json.dumps(dbt_vars)], context=context)
    yield from with_row_counts(invocation.stream(), warehouse)


def with_row_counts(events: Iterable[Any], warehouse: WarehouseResource) -> Iterator[Any]:
    """Each model's materialisation with its row count (`dagster/row_count`).

    The equivalent of dagster-dbt's `fetch_row_counts()`, which queries while dbt runs: DuckDB
    lets one process hold the file, so the counts are read once dbt has exited and let go."""
    held = list(events)
    names = {_model_name(e) for e in held if isinstance(e, (dg.Output, dg.AssetMaterialization))}
    counts = row_counts(warehouse.reader(), (n for n in names if n))
    for event in held:
        name = _model_name(event) if isinstance(event, (dg.Output, dg.AssetMaterialization)) else None
        if name in counts:
            event = event.with_metadata({**event.metadata, ROW_COUNT: counts[name]})
        yield event


def _model_name(event: Any) -> str | None:
    unique_id = event.metadata.get("unique_id")
    value = getattr(unique_id, "value", unique_id)
    return str(value).rsplit(".", 1)[-1] if value else None


@dg.asset(partitions_def=HOURLY_PARTITIONS, backfill_policy=SINGLE_RUN, group_name=GROUP, pool="warehouse",
          deps=[dg.AssetKey("fct_invoice_lines")],
          description="Balances: hourly invoice lines posted to the tenant ledger (usage debits, "
                      "SLA credits), replacing the window's postings (exactly once).")
def billing_ledger(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    window = context.partition_time_window
    store = warehouse.get()
    written = post_invoice_window(store, window.start, window.end)
    balances = store.query("SELECT tenant_id, sum(amount) AS balance FROM billing_ledger GROUP BY 1 ORDER BY 1")
    return dg.MaterializeResult(metadata={ROW_COUNT: written, "entries": written,
                                          "balances": table_metadata(balances)})


@dg.asset(partitions_def=HOURLY_PARTITIONS, backfill_policy=SINGLE_RUN, group_name=GROUP, pool="warehouse",
          deps=[billing_ledger],
          description="Budget guards: guarded tenants whose balance cannot cover the next interval or "
                      "whose spend passes a hard cap get new tasks refused and running tasks drained "
                      "after the grace period (`budget_guard` decisions for the task-drain guardrail).")
def budget_guard(context: dg.AssetExecutionContext, warehouse: WarehouseResource,
                 fleet: FleetAdapterResource) -> dg.MaterializeResult:
    adapter = fleet.get()
    now = adapter_now(adapter)
    window = context.partition_time_window
    if window.end < now - GUARD_FRESHNESS:
        return dg.MaterializeResult(metadata={"skipped": f"historical window ending {window.end.isoformat()}"})
    config = fleet.config()
    run = run_budget_guards(warehouse.get(), config, adapter.list_tasks(), now)
    refused = refused_tenants(run)
    admission = "not applied (shadow mode)" if config.loop.shadow_mode else "adapter cannot refuse tasks"
    # Only a fleet with an admission door (the simulated twin) takes the list; on others the
    # refusal stands in `decisions` for the scheduler in front of the fleet to read.
    set_refused = getattr(adapter, "set_refused_tenants", None)
    if set_refused is not None and not config.loop.shadow_mode:
        admission = set_refused(refused).detail
    table = pl.DataFrame([{"tenant": v.tenant_id, "admit": v.admit_new_tasks, "balance": str(v.balance),
                           "next_interval": str(v.next_interval_cost), "reasons": "; ".join(v.reasons)}
                          for v in run.verdicts]) if run.verdicts else pl.DataFrame()
    return dg.MaterializeResult(metadata={
        "guarded_tenants": len(run.verdicts),
        "blocked_tenants": sum(1 for v in run.verdicts if not v.admit_new_tasks),
        "drain_decisions": int(run.decisions.filter(pl.col("action") == "drain").height),
        "admission": dg.MetadataValue.text(admission),
        "verdicts": table_metadata(table),
    })


billing_assets = [billing_rate_card, usage_intervals, billing_dbt_models, billing_ledger, budget_guard]
billing_checks: list = []  # the dbt tests arrive as asset checks of billing_dbt_models
# the dbt next to this interpreter (a venv's bin/ need not be on PATH)
DBT_EXECUTABLE = str(Path(sys.executable).parent / "dbt") if (Path(sys.executable).parent / "dbt").exists() \
    else "dbt"
billing_resources = {"dbt": DbtCliResource(project_dir=DBT_PROJECT, dbt_executable=DBT_EXECUTABLE)}

billing_job = dg.define_asset_job(
    "billing_job",
    selection=dg.AssetSelection.assets(*billing_assets),
    description="Meter, rate (dbt build with tests), post balances and evaluate budget guards.",
)

billing_hourly_schedule = hourly_partition_schedule(
    billing_job, "billing_hourly_schedule", 15, "Bill the hour that just closed.",
    first_hour=HOURLY_PARTITIONS.start)


@dg.schedule(job=billing_job, cron_schedule="40 0 * * *", name="billing_daily_schedule",
             execution_timezone="UTC", default_status=default_status(), description="Close yesterday: re-bill its 24 hours in one run.")
def billing_daily_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    request = daily_rerun_request(context.scheduled_execution_time)
    return request.with_replaced_attrs(tags={**request.tags, **tick_tags(context.scheduled_execution_time)})


def billing_range_tags(start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """Tags for one billing_job run over the hourly partitions in [start, end), e.g.
    `billing_job.execute_in_process(instance=..., tags=billing_range_tags(start, end))`."""
    first = HourWindow.containing(start).start
    last = HourWindow.containing(end - dt.timedelta(microseconds=1)).start
    if last < first:
        raise ValueError(f"billing range [{start.isoformat()}, {end.isoformat()}) holds no hour")
    fmt = "%Y-%m-%d-%H:%M"
    return {"dagster/asset_partition_range_start": first.strftime(fmt),
            "dagster/asset_partition_range_end": last.strftime(fmt)}


def daily_rerun_request(when: dt.datetime) -> dg.RunRequest:
    """A ranged run over the 24 hourly partitions of the UTC day before `when`."""
    day = when.astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    first = day - dt.timedelta(days=1)
    return dg.RunRequest(run_key=f"billing-day-{first:%Y-%m-%d}", tags=billing_range_tags(first, day))


billing_schedules = [billing_hourly_schedule, billing_daily_schedule]
