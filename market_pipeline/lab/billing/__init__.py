"""Billing offline: `bench billing`, the dbt rollup against one hand-written DuckDB query."""
