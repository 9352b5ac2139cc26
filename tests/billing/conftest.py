"""Billing fixtures: the scenario of billing_testkit metered and rated once per run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from billing_testkit import LOW_TIERS, build_scenario, rate_hours, scenario
from filelock import FileLock

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.warehouse import Warehouse


@pytest.fixture(scope="session")
def billing_config() -> MarketPipelineConfig:
    return load_config(environ={"MP__BILLING__COMMITMENT_TIERS": LOW_TIERS})


@pytest.fixture(scope="session")
def rated_warehouse(
    tmp_path_factory: pytest.TempPathFactory, run_tmp_path: Path, billing_config: MarketPipelineConfig
) -> Warehouse:
    """The scenario metered and rated once a run (dbt build per hour), in a copy of each test
    process's own: the first xdist worker to need it builds it under a file lock, the other
    waits and copies it (the billing modules are spread over both workers); treat as
    read-only (warehouse_copy for tests that write)."""
    shared = run_tmp_path / "billing-rated"
    shared.mkdir(exist_ok=True)
    built, done = shared / "warehouse.duckdb", shared / "built"
    with FileLock(str(shared / "build.lock")):
        if not done.exists():
            rate_hours(build_scenario(built, billing_config, scenario()))
            if built.with_name(built.name + ".wal").exists():  # the copy takes the file alone
                raise RuntimeError(f"{built} was left with a WAL beside it")
            done.touch()
    path = tmp_path_factory.mktemp("billing") / "warehouse.duckdb"
    shutil.copy(built, path)
    return Warehouse(path)


@pytest.fixture()
def warehouse_copy(rated_warehouse: Warehouse, tmp_path: Path) -> Warehouse:
    """A private copy of the rated warehouse for tests that write."""
    target = tmp_path / "warehouse.duckdb"
    shutil.copy(rated_warehouse.path, target)
    return Warehouse(target)
