"""The tenant scope's copies: which warehouse tables exist, their rows copied out (a tenant's
rows only, for tables that name a row's owner; public tables whole), and a private in-memory
database of those copies, locked down like finance's `sql` (`sql_guard.lock_down`).
`billing.tenant_scope` decides which tables a query needs and which column names the owner.

Copies are materialised (`to_arrow_table`): in DuckDB 1.5 `.arrow()` returns a lazy reader
that the next query on the source connection invalidates, which left every table but the
last one empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import duckdb
import pyarrow as pa

from market_pipeline.warehouse.sql_guard import SqlLimits, lock_down
from market_pipeline.warehouse.store import Warehouse


def existing_tables(warehouse: Warehouse, names: Sequence[str]) -> set[str]:
    """Those of `names` that are tables (or views) of the warehouse's main schema."""
    frame = warehouse.query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'")
    present = set(frame["table_name"].to_list())
    return {n for n in names if n in present}


def copy_rows(
    warehouse: Warehouse, tables: Sequence[str], owner_columns: Mapping[str, str], tenant_id: str
) -> dict[str, pa.Table]:
    """Each of `tables` as Arrow: a table in `owner_columns` only its rows whose owner column
    is `tenant_id`, any other whole. One read-only connection for all."""
    copies: dict[str, pa.Table] = {}
    with warehouse.connect(read_only=True) as source:
        for table in tables:
            if table in owner_columns:
                column = owner_columns[table]
                copies[table] = source.execute(
                    f'SELECT * FROM main."{table}" WHERE "{column}" = ?', [tenant_id]
                ).to_arrow_table()
            else:
                copies[table] = source.execute(f'SELECT * FROM main."{table}"').to_arrow_table()
    return copies


def locked_database(copies: Mapping[str, pa.Table], limits: SqlLimits) -> duckdb.DuckDBPyConnection:
    """A new in-memory database holding `copies` as tables, locked down under `limits`."""
    con = duckdb.connect(":memory:")
    try:
        for table, arrow in copies.items():
            con.register("_rows", arrow)
            con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM _rows')
            con.unregister("_rows")
        lock_down(con, limits)
    except BaseException:
        con.close()
        raise
    return con
