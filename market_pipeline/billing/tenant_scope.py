"""Tenant-scoped SQL: a tenant's query runs where other tenants' rows do not exist.

The billing tables are copied, filtered to the tenant, into a private in-memory DuckDB;
file and network access is then switched off and the configuration locked, so the query
cannot ATTACH the warehouse or read files. Public tables (the price book and the rate
card) are copied whole: every tenant may see list prices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import duckdb
import polars as pl

from market_pipeline.billing.errors import BillingError
from market_pipeline.warehouse import Warehouse

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


def _existing(warehouse: Warehouse, names: list[str]) -> set[str]:
    frame = warehouse.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'")
    present = set(frame["table_name"].to_list())
    return {n for n in names if n in present}


def scoped_connection(warehouse: Warehouse, tenant_id: str, sql: str) -> duckdb.DuckDBPyConnection:
    """An in-memory database holding only `tenant_id`'s rows of the tables `sql` names."""
    if not tenant_id:
        raise TenantScopeError("tenant id must be a non-empty string")
    wanted = _referenced(sql, [*TENANT_TABLES, *PUBLIC_TABLES])
    present = _existing(warehouse, wanted)
    copies: dict[str, object] = {}
    with warehouse.connect(read_only=True) as source:
        for table in wanted:
            if table not in present:
                continue
            if table in TENANT_TABLES:
                column = TENANT_TABLES[table]
                copies[table] = source.execute(
                    f'SELECT * FROM main."{table}" WHERE "{column}" = ?', [tenant_id]).arrow()
            else:
                copies[table] = source.execute(f'SELECT * FROM main."{table}"').arrow()
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    for table, arrow in copies.items():
        con.register("_rows", arrow)
        con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM _rows')
        con.unregister("_rows")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def tenant_query(warehouse: Warehouse, tenant_id: str, sql: str,
                 params: list[object] | None = None) -> pl.DataFrame:
    """Run `sql` as tenant `tenant_id`: it sees only that tenant's billing rows."""
    con = scoped_connection(warehouse, tenant_id, sql)
    try:
        return con.execute(sql, params or []).pl()
    except duckdb.Error as exc:
        raise TenantScopeError(f"tenant {tenant_id!r} query failed: {exc}") from exc
    finally:
        con.close()
