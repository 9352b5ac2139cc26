"""Dagster resources: the warehouse and the node hardware adapter, both from the typed config."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.hardware.protocol import NodeAdapter
from market_pipeline.warehouse import Lake, Warehouse, open_warehouse
from market_pipeline.warehouse.profile import configured_lake


class WarehouseResource(dg.ConfigurableResource):
    """The warehouse: the DuckDB file at `path` (embedded default) or, with backend
    `ducklake`, the lake of `catalog_url` and `data_path` (cluster profile); `get()` applies
    pending migrations first."""

    path: str
    backend: str = "duckdb"
    catalog_url: str = ""
    data_path: str = ""

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "WarehouseResource":
        lake = configured_lake(config)
        if lake is None:
            return cls(path=str(config.warehouse_path))
        return cls(
            path=str(config.warehouse_path),
            backend="ducklake",
            catalog_url=lake.catalog,
            data_path=lake.data_path,
        )

    @property
    def lake(self) -> Lake | None:
        return Lake(self.catalog_url, self.data_path) if self.backend == "ducklake" else None

    def get(self) -> Warehouse:
        return open_warehouse(self.path, migrate=True, lake=self.lake)

    def reader(self) -> Warehouse:
        """For read-only use: no migration, no write lock."""
        return Warehouse(Path(self.path), lake=self.lake)


class FleetAdapterResource(dg.ConfigurableResource):
    """The node hardware adapter chosen by `adapter.backend` in the config."""

    config_path: str = ""

    def config(self) -> MarketPipelineConfig:
        return load_config(self.config_path or None)

    def get(self) -> NodeAdapter:
        from market_pipeline.hardware import make_adapter

        return make_adapter(self.config())
