"""Tenant isolation, balances and budget guards, quotes, cost reports."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import polars as pl
import pytest
from billing_testkit import (
    A100,
    T0,
    price_book,
    scenario,
)

from market_pipeline.billing.balances import (
    Account,
    post_invoice_window,
    record_payment,
    set_account,
    tenant_admission,
)
from market_pipeline.billing.cost_report import write_report
from market_pipeline.billing.errors import QuoteError
from market_pipeline.billing.guards import run_budget_guards
from market_pipeline.billing.quotes import quote
from market_pipeline.billing.tenant_scope import TenantScopeError, tenant_query
from market_pipeline.cli import main

NOON = T0 + dt.timedelta(hours=3)


def test_billing_tenant_scope_cannot_read_other_tenants(rated_warehouse):
    mine = tenant_query(
        rated_warehouse,
        "acme-research",
        "SELECT DISTINCT tenant_id FROM fct_rated_usage UNION SELECT DISTINCT tenant_id"
        ' FROM fct_invoice_lines UNION SELECT DISTINCT "BillingAccountId" FROM focus_export',
    )
    assert mine["tenant_id"].to_list() == ["acme-research"]
    asked = tenant_query(
        rated_warehouse,
        "acme-research",
        "SELECT count(*) AS n FROM stg_usage_intervals WHERE tenant_id = 'delta-vision'",
    )
    assert asked["n"].item() == 0  # delta's rows exist in the warehouse, but not in the scope
    assert (
        tenant_query(rated_warehouse, "acme-research", "SELECT count(*) AS n FROM price_book")["n"].item() > 0
    )
    escape = f"ATTACH '{rated_warehouse.path}' AS w (READ_ONLY); SELECT * FROM w.fct_rated_usage"
    with pytest.raises(TenantScopeError):
        tenant_query(rated_warehouse, "acme-research", escape)
    with pytest.raises(TenantScopeError):
        tenant_query(rated_warehouse, "acme-research", f"SELECT * FROM read_csv('{rated_warehouse.path}')")
    with pytest.raises(TenantScopeError):
        tenant_query(rated_warehouse, "acme-research", "SET enable_external_access = true")


def test_billing_ledger_posting_is_exactly_once_and_guards_block_and_drain(warehouse_copy, billing_config):
    start, end = T0, T0 + dt.timedelta(hours=2)
    first = post_invoice_window(warehouse_copy, start, end)
    assert post_invoice_window(warehouse_copy, start, end) == first  # repost replaces
    usage = warehouse_copy.query(
        "SELECT sum(amount) AS a FROM billing_ledger WHERE tenant_id = 'acme-research'"
    )
    billed = warehouse_copy.query(
        "SELECT sum(billed_cost) AS b FROM fct_invoice_lines"
        " WHERE tenant_id = 'acme-research' AND period_grain = 'hour'"
    )
    assert usage["a"].item() == -billed["b"].item()
    set_account(warehouse_copy, Account("acme-research", prepaid=True))
    record_payment(warehouse_copy, "acme-research", Decimal("4.00"), "wire-1")
    record_payment(warehouse_copy, "acme-research", Decimal("4.00"), "wire-1")  # idempotent
    set_account(warehouse_copy, Account("delta-vision", prepaid=False, hard_cap_daily=Decimal("1.00")))
    fleet = scenario()
    running = [fleet.tasks["t-drain"], fleet.tasks["t-full"], fleet.tasks["t-fault"], fleet.tasks["t-a10"]]
    run = run_budget_guards(warehouse_copy, billing_config, running, NOON)
    verdicts = {v.tenant_id: v for v in run.verdicts}
    assert set(verdicts) == {"acme-research", "delta-vision"}  # only guarded tenants
    acme = verdicts["acme-research"]
    assert acme.balance == Decimal("4.00") - billed["b"].item()
    assert not acme.admit_new_tasks and acme.drain_running  # 0.7 left < next 5 min of 2.5 GPUs
    assert acme.drain_after == NOON + dt.timedelta(seconds=billing_config.billing.grace_seconds)
    assert not verdicts["delta-vision"].admit_new_tasks  # spent 1.74 - 0.17 today > cap 1.00
    drains = run.decisions.filter(pl.col("action") == "drain")
    assert sorted(drains["target"].to_list()) == ["t-drain", "t-fault", "t-full"]
    assert tenant_admission(warehouse_copy, "acme-research", NOON)[0] is False
    assert tenant_admission(warehouse_copy, "cobalt-labs", NOON) == (True, [])
    record_payment(warehouse_copy, "acme-research", Decimal("100"), "wire-2")
    later = NOON + dt.timedelta(hours=1)
    again = {
        v.tenant_id: v for v in run_budget_guards(warehouse_copy, billing_config, running, later).verdicts
    }
    assert (
        again["acme-research"].admit_new_tasks and tenant_admission(warehouse_copy, "acme-research", later)[0]
    )


def test_billing_quote_expected_cost_and_band(warehouse_copy, billing_config):
    plain = quote(billing_config, None, "acme-research", A100, gpus=4, hours=2, start=T0)
    assert plain.band_method == "price_bounds"
    # configured base 2.40 x 4 GPUs x 2 peak hours x 1.15
    assert plain.expected_cost == Decimal("22.08") and plain.low_90 <= plain.expected_cost <= plain.high_90
    booked = quote(
        billing_config,
        warehouse_copy,
        "acme-research",
        A100,
        gpus=4,
        hours=2,
        resource_class="drainable",
        start=T0 + dt.timedelta(minutes=20),
    )
    assert booked.components["drainability_discount"] < 0 and booked.unit_price_now < plain.unit_price_now
    history = pl.concat(
        [price_book().filter(pl.col("pool_id") == "none")]
        + [
            price_book()
            .head(1)
            .with_columns(
                pl.lit(T0 - dt.timedelta(hours=200 - i)).dt.cast_time_unit("us").alias("effective_from"),
                pl.lit(Decimal(f"{2.4 + 0.3 * ((i * 7) % 5) / 5:.6f}"))
                .cast(pl.Decimal(18, 6))
                .alias("price_per_gpu_hour"),
            )
            for i in range(100)
        ]
    )
    warehouse_copy.append("price_book", history)
    rich = quote(
        billing_config,
        warehouse_copy,
        "cobalt-labs",
        A100,
        gpus=1,
        hours=1,
        start=T0 - dt.timedelta(hours=50),
    )
    assert rich.band_method == "empirical_90" and rich.band_samples >= 20
    assert rich.low_90 < rich.expected_cost < rich.high_90
    with pytest.raises(QuoteError, match="unknown tenant"):
        quote(billing_config, None, "nobody", A100, 1, 1)
    with pytest.raises(QuoteError, match="not drain tolerant"):
        quote(billing_config, None, "blue-inference", A100, 1, 1, resource_class="drainable")


def test_billing_cli_quote_and_cost_report(rated_warehouse, tmp_path, capsys):
    code = main(
        [
            "quote",
            "--tenant",
            "acme-research",
            "--pool",
            A100,
            "--gpus",
            "2",
            "--hours",
            "1.5",
            "--start",
            T0.isoformat(),
            "--warehouse",
            str(rated_warehouse.path),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["low_90"] <= out["expected_cost"] <= out["high_90"] and out["currency"] == "USD"
    html_path = tmp_path / "acme.html"
    assert (
        main(
            [
                "cost-report",
                "--tenant",
                "acme-research",
                "--warehouse",
                str(rated_warehouse.path),
                "--out",
                str(html_path),
                "--json",
            ]
        )
        == 0
    )
    page = html_path.read_text()
    assert "acme-research" in page and "data:image/png;base64," in page and "drainability" in page
    assert "delta-vision" not in page and "blue-inference" not in page
    png = write_report(rated_warehouse, "delta-vision", tmp_path / "delta.png", "png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
