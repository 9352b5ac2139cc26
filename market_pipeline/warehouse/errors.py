"""The warehouse's error type, shared by both backends (DuckDB file, DuckLake)."""


class WarehouseError(RuntimeError):
    """A warehouse operation failed; the message names the table, query or service."""
