"""Typed readers of what billing reads back outside dbt: a pool's price history and a
tenant's month-to-date GPU-hours (quotes), the tasks an hour's partition left running and
the drains' billing events (metering), row counts of the dbt relations (the operator's
metadata), and a tenant's cost report (its rows through the tenant scope, passed in as `run`).
Each raises WarehouseError as the store does (a table not there yet included): the callers
decide what a missing table means.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from market_pipeline.warehouse.service_readers import TenantRunner
from market_pipeline.warehouse.store import Warehouse

# -- quotes ------------------------------------------------------------------------------


def price_history(warehouse: Warehouse, pool_id: str) -> pl.DataFrame:
    """The pool's price book, oldest first: effective_from, resource_class, price_per_gpu_hour."""
    return warehouse.query(
        "SELECT effective_from, resource_class, price_per_gpu_hour FROM price_book"
        " WHERE pool_id = ? ORDER BY effective_from",
        [pool_id],
    )


def billed_gpu_hours(warehouse: Warehouse, tenant_id: str, start: datetime, end: datetime) -> pl.DataFrame:
    """The tenant's billed usage GPU-hours of the hourly invoice lines in [start, end): one row, h."""
    # the hourly invoice lines hold the same sums as the rated rows (per-row rounded
    # GPU-hours), already aggregated: no need to rate the month's usage again
    return warehouse.query(
        "SELECT coalesce(sum(consumed_gpu_hours), 0) AS h FROM fct_invoice_lines"
        " WHERE tenant_id = ? AND period_grain = 'hour' AND charge_category = 'Usage'"
        " AND period_start >= ? AND period_start < ?",
        [tenant_id, start, end],
    )


# -- metering ----------------------------------------------------------------------------


def running_at_partition_end(warehouse: Warehouse, partition_key: str) -> pl.DataFrame:
    """Tasks metering left running at the end of partition `partition_key`: task_id,
    drain_signal_at (their earliest, or null)."""
    return warehouse.query(
        "SELECT task_id, min(drain_signal_at) AS drain_signal_at FROM usage_intervals"
        " WHERE partition_key = ? AND end_reason = 'running' GROUP BY task_id",
        [partition_key],
    )


def drain_billing_records(warehouse: Warehouse, end: datetime, task_ids: Sequence[str]) -> pl.DataFrame:
    """Per task of `task_ids` with a drain billing event before `end`: task_id, signal (its
    earliest drain signal), fault (a platform fault ended it before `end`)."""
    return warehouse.query(
        "SELECT task_id, min(drain_signal_at) AS signal,"
        " bool_or(platform_fault AND task_ended_at < ?) AS fault"
        " FROM drain_billing_events WHERE list_contains(?, task_id)"
        " AND (drain_signal_at < ? OR task_ended_at < ?) GROUP BY task_id",
        [end, task_ids, end, end],
    )


# -- the dbt project's metadata ----------------------------------------------------------


def relation_row_counts(store: Warehouse, names: Sequence[str]) -> dict[str, int]:
    """Rows in each of `names` (plain identifiers) that is a table or view of the warehouse;
    names of no relation are left out."""
    present = set(
        store.query(
            "SELECT table_name FROM information_schema.tables WHERE list_contains(?, table_name)", [names]
        )["table_name"]
    )
    counts = {}
    for name in names:
        if name in present:
            counts[name] = int(store.query(f'SELECT count(*) AS n FROM "{name}"')["n"][0])
    return counts


# -- a tenant's cost report (run through the tenant scope) --------------------------------


def cost_report_daily(run: TenantRunner) -> pl.DataFrame:
    """Every column of the tenant's daily cost (dbt mart `agg_tenant_daily_cost`), by day."""
    return run("SELECT * FROM agg_tenant_daily_cost ORDER BY day", [])


def cost_report_pools(run: TenantRunner) -> pl.DataFrame:
    """The pools the tenant was billed usage in: pool_id."""
    return run("SELECT DISTINCT pool_id FROM fct_invoice_lines WHERE charge_category = 'Usage'", [])


def cost_report_prices(run: TenantRunner, pool_ids: list[str]) -> pl.DataFrame:
    """The price book of `pool_ids`, oldest first: effective_from, pool_id, resource_class,
    price_per_gpu_hour."""
    return run(
        "SELECT effective_from, pool_id, resource_class, price_per_gpu_hour FROM price_book"
        " WHERE list_contains(?, pool_id) ORDER BY effective_from",
        [pool_ids],
    )


def cost_report_credits(run: TenantRunner) -> pl.DataFrame:
    """The tenant's SLA credits, oldest first: fault_at, task_id, pool_id, end_reason,
    affected_cost, sla_credit_rate, credit_amount."""
    return run(
        "SELECT fault_at, task_id, pool_id, end_reason, affected_cost, sla_credit_rate, credit_amount"
        " FROM fct_sla_credits ORDER BY fault_at",
        [],
    )
