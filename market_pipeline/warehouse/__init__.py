"""The DuckDB warehouse: its schema (`schema`, versioned idempotent migrations) and its store
(`store`: connections, typed read/append helpers).

DuckDB allows one writing process. Writers are serialised by the Dagster pool `warehouse`
(limit 1); readers open read-only. Opening still retries on a lock conflict so that a
reader racing a writer (or two CLI calls) waits instead of losing work.
"""

from market_pipeline.warehouse.schema import MIGRATIONS, Migration
from market_pipeline.warehouse.store import (
    LOCK_RETRY_SECONDS,
    TableRewrite,
    Warehouse,
    WarehouseError,
    open_warehouse,
)

__all__ = [
    "LOCK_RETRY_SECONDS",
    "MIGRATIONS",
    "Migration",
    "TableRewrite",
    "Warehouse",
    "WarehouseError",
    "open_warehouse",
]
