"""Dagster wiring: metering, dbt models (tests as asset checks), ledger, guards, schedules."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
from billing_testkit import HOURS, LOW_TIERS, invoice_snapshot, price_book, scenario

from assets.billing.assets import billing_assets
from assets.billing.dbt import billing_dbt_models, dbt_resource
from assets.billing.jobs import billing_job
from assets.billing.schedules import billing_daily_schedule, billing_range_tags, daily_rerun_request
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.metering.assets import metering_assets
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.config import load_config
from market_pipeline.warehouse import Warehouse, open_warehouse

FLEET = scenario()


class ScriptedFleetResource(FleetAdapterResource):
    def get(self):
        return FLEET

    def config(self):
        return load_config(environ={"MP__BILLING__COMMITMENT_TIERS": LOW_TIERS})


@pytest.mark.slow
def test_billing_job_meters_rates_and_checks_a_partition_range(tmp_path):
    path = tmp_path / "warehouse.duckdb"
    warehouse = open_warehouse(path)
    warehouse.append("price_book", price_book())
    refresh_rate_card(warehouse, ScriptedFleetResource().config())
    defs = dg.Definitions(
        assets=[*billing_assets, *metering_assets, billing_dbt_models()],
        jobs=[billing_job],
        resources={
            "warehouse": WarehouseResource(path=str(path)),
            "fleet": ScriptedFleetResource(),
            "dbt": dbt_resource(),
        },
    )
    job = defs.resolve_job_def("billing_job")
    result = job.execute_in_process(tags=billing_range_tags(HOURS[0].start, HOURS[1].end))
    assert result.success
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert {
        "usage_intervals",
        "fct_rated_usage",
        "fct_invoice_lines",
        "focus_export",
        "fct_sla_credits",
        "agg_tenant_daily_cost",
        "agg_revenue_by_pool",
        "billing_ledger",
        "budget_guard",
    } <= materialized
    checks = result.get_asset_check_evaluations()
    names = {c.check_name for c in checks}
    assert {
        "assert_focus_total_equals_invoice_total",
        "assert_billed_le_metered_seconds",
        "assert_every_interval_rated",
    } <= names
    assert checks and all(c.passed for c in checks)
    # dbt models carry their row counts, read once dbt let go of the warehouse
    events = {
        e.asset_key.to_user_string(): e.materialization for e in result.get_asset_materialization_events()
    }
    lines = Warehouse(path).query("SELECT count(*) AS n FROM fct_invoice_lines")["n"].item()
    assert lines > 0 and events["fct_invoice_lines"].metadata["dagster/row_count"].value == lines
    assert events["usage_intervals"].metadata["dagster/row_count"].value > 0
    snapshot = invoice_snapshot(Warehouse(path))
    assert snapshot["credits"] and snapshot["invoice"]
    ledger = Warehouse(path).query("SELECT count(*) AS n FROM billing_ledger")
    assert ledger["n"].item() > 0


def test_billing_schedules_cover_the_hour_and_the_day():
    from sensors.definitions import loop_schedules

    billing = [s for s in loop_schedules(load_config()) if s.job_name == "billing_job"]
    assert {s.name for s in billing} == {"billing_hourly_schedule", "billing_daily_schedule"}
    request = daily_rerun_request(dt.datetime(2026, 3, 3, 0, 40, tzinfo=dt.timezone.utc))
    assert request.tags["dagster/asset_partition_range_start"] == "2026-03-02-00:00"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-03-02-23:00"
    assert billing_daily_schedule().job_name == "billing_job"
    billed = {a.key.to_user_string() for a in [*billing_assets, *metering_assets]}
    assert {"billing_rate_card", "usage_intervals"} <= billed


def test_dbt_models_and_tests_read_as_descriptions_not_sql():
    from sensors.definitions import defs

    graph = defs.get_repository_def().asset_graph
    invoice = graph.get(dg.AssetKey("fct_invoice_lines")).description
    assert invoice.startswith("Hourly and daily invoice lines") and "Raw SQL" not in invoice
    specs = {s.name: s for a in defs.assets if isinstance(a, dg.AssetsDefinition) for s in a.check_specs}
    assert (
        specs["not_null_fct_invoice_lines_billed_cost"].description
        == "fct_invoice_lines.billed_cost is never null."
    )
    assert specs["assert_credits_not_above_affected_cost"].description == (
        "An SLA credit never exceeds the cost it compensates, nor goes negative."
    )
    assert all(s.description for s in specs.values())
