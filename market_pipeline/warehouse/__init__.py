"""The warehouse: its schema (`schema`, versioned idempotent migrations) and its store
(`store`: connections, typed read/append helpers), on one of two backends.

The embedded default is one DuckDB file, which allows one writing process: writers are
serialised by the Dagster pool `warehouse` (limit 1); readers open read-only. Opening still
retries on a lock conflict so that a reader racing a writer (or two CLI calls) waits instead of
losing work. The cluster profile (`lake`) is a DuckLake: catalog in PostgreSQL, Parquet data;
each writer commits its own transaction and retries when it loses to a concurrent one.
"""

from market_pipeline.warehouse.errors import WarehouseError
from market_pipeline.warehouse.lake import Lake, is_transaction_conflict
from market_pipeline.warehouse.schema import MIGRATIONS, Migration
from market_pipeline.warehouse.store import (
    LOCK_RETRY_SECONDS,
    TableRewrite,
    Warehouse,
    open_warehouse,
    raise_unless_conflict,
    rollback,
)

__all__ = [
    "LOCK_RETRY_SECONDS",
    "Lake",
    "MIGRATIONS",
    "Migration",
    "TableRewrite",
    "Warehouse",
    "WarehouseError",
    "is_transaction_conflict",
    "open_warehouse",
    "raise_unless_conflict",
    "rollback",
]
