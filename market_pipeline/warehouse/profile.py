"""The warehouse the configuration names: the embedded DuckDB file (`backend = "duckdb"`, the
default) or the cluster profile's DuckLake (`backend = "ducklake"`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.lake import Lake
from market_pipeline.warehouse.store import Warehouse, open_warehouse

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig


def configured_lake(config: MarketPipelineConfig) -> Lake | None:
    """The configured DuckLake, or None on the embedded default."""
    if config.warehouse.backend != "ducklake":
        return None
    return Lake(config.warehouse.catalog_url, config.lake_data_path)


def configured_control(config: MarketPipelineConfig) -> ControlStore | None:
    """The control state's PostgreSQL, or None where it lives in the warehouse (the default)."""
    if config.control.backend != "postgres":
        return None
    return ControlStore(config.control_url, config.control.schema_name)


def configured_warehouse(config: MarketPipelineConfig, migrate: bool = False) -> Warehouse:
    """The configured warehouse (pending migrations applied with `migrate`)."""
    return open_warehouse(
        config.warehouse_path,
        migrate=migrate,
        lake=configured_lake(config),
        control=configured_control(config),
    )
