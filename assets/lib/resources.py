"""Dagster resources: the warehouse and the node hardware adapter, both from the typed config."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.hardware.protocol import NodeAdapter
from market_pipeline.warehouse import Lake, Warehouse, open_warehouse
from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.profile import configured_control, configured_lake


class WarehouseResource(dg.ConfigurableResource):
    """The warehouse: the DuckDB file at `path` (embedded default) or, with backend
    `ducklake`, the lake of `catalog_url` and `data_path` (cluster profile); `get()` applies
    pending migrations first."""

    path: str
    backend: str = "duckdb"
    catalog_url: str = ""
    data_path: str = ""
    # the control state's PostgreSQL (cluster profile); empty: in the warehouse
    control_url: str = ""
    control_schema: str = ""

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "WarehouseResource":
        lake, control = configured_lake(config), configured_control(config)
        controls = {"control_url": control.url, "control_schema": control.schema} if control else {}
        if lake is None:
            return cls(path=str(config.warehouse_path), **controls)
        return cls(
            path=str(config.warehouse_path),
            backend="ducklake",
            catalog_url=lake.catalog,
            data_path=lake.data_path,
            **controls,
        )

    @property
    def lake(self) -> Lake | None:
        return Lake(self.catalog_url, self.data_path) if self.backend == "ducklake" else None

    @property
    def control(self) -> ControlStore | None:
        return ControlStore(self.control_url, self.control_schema) if self.control_url else None

    def get(self) -> Warehouse:
        return open_warehouse(self.path, migrate=True, lake=self.lake, control=self.control)

    def reader(self) -> Warehouse:
        """For read-only use: no migration, no write lock."""
        return Warehouse(Path(self.path), lake=self.lake, control=self.control)


class FleetAdapterResource(dg.ConfigurableResource):
    """The typed config, and the node hardware adapter chosen by its `adapter.backend`.

    The config is parsed once per run: when Dagster sets the resource up for the run (once for
    the in-process executor; once per step process under Celery), and every asset, check and op
    of the run reads that one parsed `MarketPipelineConfig` through `config()`. The next run
    parses again, so an edited config file takes effect at the next run, never halfway through
    one. Outside a run (a test, a script) the first `config()` parses it."""

    config_path: str = ""
    _config: MarketPipelineConfig | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._config = load_config(self.config_path or None)

    def config(self) -> MarketPipelineConfig:
        if self._config is None:
            self._config = load_config(self.config_path or None)
        return self._config

    def get(self) -> NodeAdapter:
        from market_pipeline.hardware import make_adapter

        return make_adapter(self.config())
