"""The billing rollup without Dagster: rate card, dbt build of a window, ledger posting.

Dagster runs the same steps as assets (`assets/billing/`, with metering in `assets/metering/`); the CLI and tests use this.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from market_pipeline.billing.balances import post_invoice_window
from market_pipeline.billing.dbt_project import UNIT_TESTS_EXCLUDED, DbtRun, billing_vars, run_dbt
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.warehouse import Warehouse

BILLING_SELECTOR = (
    "+focus_export",
    "+agg_tenant_daily_cost",
    "+agg_revenue_by_pool",
    "+agg_tenant_capacity_cost",
)


@dataclass(frozen=True)
class RollupResult:
    dbt: DbtRun
    ledger_entries: int


def rollup_window(
    warehouse: Warehouse,
    config: MarketPipelineConfig,
    start: dt.datetime | None,
    end: dt.datetime | None,
    run_tests: bool = True,
    post_ledger: bool = True,
) -> RollupResult:
    """Build (and test) the billing marts for [start, end); all hours when both are None."""
    refresh_rate_card(warehouse, config)
    dbt_vars = billing_vars(config, start, end)
    command = (
        ["build", "--select", *BILLING_SELECTOR, *UNIT_TESTS_EXCLUDED]
        if run_tests
        else ["run", "--select", *BILLING_SELECTOR]
    )
    result = run_dbt(command, warehouse.path, dbt_vars=dbt_vars, lake=warehouse.lake)
    entries = 0
    if post_ledger:
        lo = start or dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        hi = end or dt.datetime(2200, 1, 1, tzinfo=dt.timezone.utc)
        entries = post_invoice_window(warehouse, lo, hi)
    return RollupResult(result, entries)
