"""Service fixtures: one rated warehouse per session, a server per module on its own key store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from service_harness.kit import ACME, BLUE, build_service_warehouse, start_server

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.service.context import ServiceContext
from market_pipeline.warehouse import Warehouse


@pytest.fixture(scope="session")
def service_config() -> MarketPipelineConfig:
    return load_config()


@pytest.fixture(scope="session")
def service_warehouse(run_tmp_path: Path, service_config) -> Warehouse:
    """Built once for the whole run, shared by the xdist workers (the first builds it under a
    file lock, the others wait and reuse it); treat as read-only (copy it to write)."""
    shared = run_tmp_path / "service-warehouse"
    shared.mkdir(exist_ok=True)
    path, built = shared / "warehouse.duckdb", shared / "built"
    with FileLock(str(shared / "build.lock")):
        if not built.exists():
            build_service_warehouse(path, service_config)
            built.touch()
    return Warehouse(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, service_warehouse: Warehouse, service_config):
    """A server over a private copy of the warehouse with keys for two tenants and the operator."""
    folder = tmp_path_factory.mktemp("served")
    path = folder / "warehouse.duckdb"
    shutil.copy(service_warehouse.path, path)
    config = service_config.model_copy(
        update={
            "service": service_config.service.model_copy(
                update={
                    "store_path": str(folder / "svc.sqlite"),
                    "rate_limit_per_second": 1000.0,
                    "rate_limit_burst": 1000,
                }
            )
        }
    )
    context = ServiceContext.build(config, str(path))
    keys = {
        "acme": context.store.create_key("tenant", ACME)[1],
        "blue": context.store.create_key("tenant", BLUE)[1],
        "operator": context.store.create_key("operator", None)[1],
    }
    server = start_server(context)
    yield server, keys
    server.stop()
