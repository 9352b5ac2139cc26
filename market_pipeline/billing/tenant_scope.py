"""Tenant-scoped SQL: a tenant's query runs where other tenants' rows do not exist.

The billing tables are copied, filtered to the tenant, into a private in-memory DuckDB;
that database is then locked down like finance's `sql` (sql_guard: one read-only
statement, no file or network access, locked configuration, time, memory and row limits),
so the query cannot ATTACH the warehouse or read files. Public tables (the price book and
the rate card) are copied whole: every tenant may see list prices.

The copying and the private database are `warehouse.tenant_copies`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

import duckdb
import polars as pl

from market_pipeline.billing.errors import BillingError
from market_pipeline.warehouse import Warehouse, tenant_copies
from market_pipeline.warehouse.sql_guard import SqlLimits, SqlRefused, check_read_only, run_limited

# Table -> the column naming the tenant that owns a row.
TENANT_TABLES: Mapping[str, str] = {
    "stg_usage_intervals": "tenant_id",
    "fct_rated_usage": "tenant_id",
    "fct_sla_credits": "tenant_id",
    "fct_invoice_lines": "tenant_id",
    "agg_tenant_daily_cost": "tenant_id",
    "focus_export": "BillingAccountId",
    "billing_accounts": "tenant_id",
    "billing_ledger": "tenant_id",
}
PUBLIC_TABLES: tuple[str, ...] = (
    "price_book",
    "billing_rate_card_time",
    "billing_rate_card_zones",
    "billing_rate_card_pools",
    "billing_commitment_tiers",
    "billing_terms",
)


class TenantScopeError(BillingError):
    """A tenant-scoped query was malformed or named no tenant."""


def _referenced(sql: str, tables: list[str]) -> list[str]:
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}
    return [t for t in tables if t.lower() in words]


def scoped_connection(
    warehouse: Warehouse, tenant_id: str, sql: str, limits: SqlLimits | None = None
) -> duckdb.DuckDBPyConnection:
    """A locked in-memory database holding only `tenant_id`'s rows of the tables `sql` names."""
    if not tenant_id:
        raise TenantScopeError("tenant id must be a non-empty string")
    wanted = _referenced(sql, [*TENANT_TABLES, *PUBLIC_TABLES])
    present = tenant_copies.existing_tables(warehouse, wanted)
    copies = tenant_copies.copy_rows(warehouse, [t for t in wanted if t in present], TENANT_TABLES, tenant_id)
    return tenant_copies.locked_database(copies, limits or SqlLimits())


def tenant_query(
    warehouse: Warehouse,
    tenant_id: str,
    sql: str,
    params: list[object] | None = None,
    limits: SqlLimits | None = None,
    on_start: Callable[[], None] | None = None,
) -> pl.DataFrame:
    """Run `sql` as tenant `tenant_id`: it sees only that tenant's billing rows."""
    limits = limits or SqlLimits()
    try:
        check_read_only(sql)  # before any copy: a refused query costs nothing
    except SqlRefused as exc:
        raise TenantScopeError(f"tenant {tenant_id!r} query refused: {exc}") from None
    con = scoped_connection(warehouse, tenant_id, sql, limits)
    if on_start is not None:
        on_start()
    try:
        return run_limited(con, sql, limits, params)
    except SqlRefused as exc:
        raise TenantScopeError(f"tenant {tenant_id!r} query failed: {exc}") from None
    finally:
        con.close()


def render_tenant_query(
    warehouse_path: str, tenant_id: str, sql: str, *, limits: SqlLimits, on_start: Callable[[], None]
) -> str:
    """`tenant-sql`'s JSON output; runs in the bounded child process (warehouse/isolated.py),
    so the copy of the tenant's rows is bounded too."""
    from pathlib import Path

    frame = tenant_query(Warehouse(Path(warehouse_path)), tenant_id, sql, limits=limits, on_start=on_start)
    return json.dumps(frame.to_dicts(), default=str)
