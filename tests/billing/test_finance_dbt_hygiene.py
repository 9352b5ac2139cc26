"""dbt hygiene: unit tests of the money macros, source freshness on usage and prices,
exposures for the cost report and the exports."""

from __future__ import annotations

import datetime as dt

import duckdb

from market_pipeline.billing.dbt_project import cached_manifest, run_dbt


def test_money_macro_unit_tests_pass(rated_warehouse):
    run = run_dbt(["test", "--select", "test_type:unit"], rated_warehouse.path, raise_on_failure=False)
    names = {name for name, _ in run.node_seconds}
    assert run.success, run.failures
    assert {
        "money_rated_rows_round_half_up_at_each_step",
        "money_nano_units_to_decimal_and_unit_prices",
        "money_decimal_ratio_rounds_half_up_and_is_null_on_zero",
    } <= names


def test_source_freshness_flags_stale_usage_and_prices(warehouse_copy):
    stale = run_dbt(["source", "freshness"], warehouse_copy.path, raise_on_failure=False)
    assert not stale.success  # the scenario's usage and prices are from March 2026
    assert {"usage_intervals", "price_book"} <= {f.split(":")[0].split(".")[-1] for f in stale.failures}
    now = dt.datetime.now(dt.timezone.utc)
    with duckdb.connect(str(warehouse_copy.path)) as con:
        con.execute(
            "UPDATE usage_intervals SET ended_at = ? WHERE interval_id = (SELECT min(interval_id)"
            " FROM usage_intervals)",
            [now],
        )
        con.execute("UPDATE price_book SET effective_from = ? WHERE solve_id = 'solve-0'", [now])
    fresh = run_dbt(["source", "freshness"], warehouse_copy.path, raise_on_failure=False)
    assert fresh.success, fresh.failures


def test_exposures_name_the_cost_report_and_the_exports():
    exposures = cached_manifest().exposures
    report = exposures["exposure.market_billing.tenant_cost_report"]
    assert "model.market_billing.agg_tenant_daily_cost" in report.depends_on.nodes
    focus = exposures["exposure.market_billing.focus_file_export"]
    assert focus.depends_on.nodes == ["model.market_billing.focus_export"]
    finance = exposures["exposure.market_billing.finance_file_exports"]
    assert "model.market_billing.agg_pool_economics" in finance.depends_on.nodes
