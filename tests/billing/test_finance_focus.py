"""FOCUS 1.2 on focus_export: the columns, PricingCategory and CommitmentDiscount*, the spec's
rules as named dbt tests (each one fails on a row that breaks it), and the dbt contracts."""

from __future__ import annotations

import shutil

import duckdb
import pytest

from market_pipeline.billing.dbt_project import DBT_PROJECT_DIR, cached_manifest, run_dbt
from market_pipeline.billing.errors import RatingError

MANDATORY = {
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
}
CONDITIONAL = {
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "InvoiceId",
    "SkuId",
    "SkuMeter",
    "SkuPriceId",
    "SkuPriceDetails",
    "PricingCurrency",
    "PricingCurrencyListUnitPrice",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "BillingAccountType",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "ServiceSubcategory",
    "PricingCategory",
}


def focus_tests(run) -> dict[str, str]:
    """focus_1_2_* test name -> pass | fail (a failure reads "test.market_billing.NAME[.hash]: ...")."""
    failed = {failure.split(":")[0].split(".")[2] for failure in run.failures}
    return {
        name: "fail" if name in failed else "pass"
        for name, _ in run.node_seconds
        if name.startswith("focus_1_2_")
    }


def test_focus_export_has_the_mandatory_and_applicable_conditional_columns(rated_warehouse):
    columns = rated_warehouse.query("SELECT * FROM focus_export LIMIT 0").columns
    assert MANDATORY | CONDITIONAL <= set(columns)
    custom = [c for c in columns if c.startswith("x_")]
    assert columns[-len(custom) :] == custom and all(
        c in MANDATORY | CONDITIONAL
        or c.startswith("x_")
        or c
        in {
            "AvailabilityZone",
            "ChargeFrequency",
            "ListUnitPrice",
            "ContractedUnitPrice",
            "ConsumedQuantity",
            "ConsumedUnit",
            "RegionId",
            "RegionName",
            "ResourceId",
            "ResourceName",
            "ResourceType",
            "Tags",
        }
        for c in columns
    )
    node = cached_manifest().nodes["model.market_billing.focus_export"]
    assert node.meta["focus_version"] == "1.2"


def test_pricing_category_is_dynamic_for_solver_prices_and_never_committed_without_a_commitment(
    rated_warehouse,
):
    rows = rated_warehouse.query(
        'SELECT "ChargeCategory" AS c, "PricingCategory" AS p, x_PriceSource AS s,'
        ' x_VolumeDiscountRate AS v, "CommitmentDiscountId" AS id FROM focus_export'
    )
    usage = rows.filter(rows["c"] == "Usage")
    assert set(usage.filter(usage["s"].str.starts_with("price_book"))["p"]) == {"Dynamic"}
    assert set(usage.filter(usage["s"].str.starts_with("config_base_price"))["p"]) == {"Standard"}
    assert usage.filter(usage["v"] > 0).height > 0  # volume tier rows exist, and are not "Committed"
    assert "Committed" not in set(rows["p"]) and rows["id"].null_count() == rows.height
    assert rows.filter(rows["c"] == "Credit")["p"].null_count() == rows.filter(rows["c"] == "Credit").height
    invoices = rated_warehouse.query('SELECT DISTINCT "InvoiceId" FROM focus_export ORDER BY 1')["InvoiceId"]
    assert invoices.to_list()[0] == "INV-2026-03-acme-research"


def test_every_encoded_focus_rule_passes_on_the_rated_export(warehouse_copy):
    run = run_dbt(
        ["test", "--select", "focus_export", "--exclude-resource-type", "unit_test"],
        warehouse_copy.path,
        raise_on_failure=False,
    )
    results = focus_tests(run)
    assert len(results) >= 50 and set(results.values()) == {"pass"}, run.failures


def test_focus_rules_fail_on_rows_that_break_them(warehouse_copy):
    with duckdb.connect(str(warehouse_copy.path)) as con:
        row = con.execute(
            "SELECT min(x_FocusRowId) FROM focus_export WHERE \"ChargeCategory\" = 'Usage'"
        ).fetchone()[0]
        con.execute(
            """UPDATE focus_export SET "PricingCategory" = 'Committed', "ResourceName" = "ResourceId",
                       "ListCost" = "ListCost" + 0.01, "ChargeDescription" = ' ', "Tags" = '{"team": "a"}'
                       WHERE x_FocusRowId = ?""",
            [row],
        )
    run = run_dbt(
        ["test", "--select", "focus_export", "--exclude-resource-type", "unit_test"],
        warehouse_copy.path,
        raise_on_failure=False,
    )
    failed = {name for name, status in focus_tests(run).items() if status == "fail"}
    assert failed == {
        "focus_1_2_PricingCategory_Committed_iff_CommitmentDiscountId",
        "focus_1_2_ResourceName_does_not_duplicate_system_ResourceId",
        "focus_1_2_ListCost_is_ListUnitPrice_times_PricingQuantity",
        "focus_1_2_null_handling_no_empty_strings",
        "focus_1_2_Tags_key_value_format_provider_prefix",
    }


def test_contracts_are_enforced_on_focus_export_and_invoice_lines(warehouse_copy, tmp_path):
    nodes = cached_manifest().nodes
    for model in ("focus_export", "fct_invoice_lines"):
        assert nodes[f"model.market_billing.{model}"].config.contract.enforced
    project = tmp_path / "dbt"
    shutil.copytree(DBT_PROJECT_DIR, project, ignore=shutil.ignore_patterns("target", "logs"))
    model = project / "models" / "marts" / "fct_invoice_lines.sql"
    model.write_text(
        model.read_text().replace("cast(billed_seconds as bigint)", "cast(billed_seconds as integer)")
    )
    with pytest.raises(RatingError, match="(?i)contract"):
        run_dbt(
            ["run", "--select", "fct_invoice_lines"],
            warehouse_copy.path,
            project_dir=project,
            target_path=tmp_path / "target",
            reuse_manifest=False,
        )
