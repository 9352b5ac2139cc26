"""Dagster resources: the warehouse and the node hardware adapter, both from the typed config."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.hardware.protocol import NodeAdapter
from market_pipeline.warehouse import Warehouse, open_warehouse


class WarehouseResource(dg.ConfigurableResource):
    """The DuckDB warehouse file; `get()` applies pending migrations first."""

    path: str

    def get(self) -> Warehouse:
        return open_warehouse(self.path, migrate=True)

    def reader(self) -> Warehouse:
        """For read-only use: no migration, no write lock."""
        return Warehouse(Path(self.path))


class FleetAdapterResource(dg.ConfigurableResource):
    """The node hardware adapter chosen by `adapter.backend` in the config."""

    config_path: str = ""

    def config(self) -> MarketPipelineConfig:
        return load_config(self.config_path or None)

    def get(self) -> NodeAdapter:
        from market_pipeline.hardware import make_adapter

        return make_adapter(self.config())
