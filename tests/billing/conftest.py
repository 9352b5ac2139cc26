"""Billing fixtures: the scenario of billing_testkit metered and rated once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from billing_testkit import LOW_TIERS, build_scenario, rate_hours, scenario

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.warehouse import Warehouse


@pytest.fixture(scope="session")
def billing_config() -> MarketPipelineConfig:
    return load_config(environ={"MP__BILLING__COMMITMENT_TIERS": LOW_TIERS})


@pytest.fixture(scope="session")
def rated_warehouse(
    tmp_path_factory: pytest.TempPathFactory, billing_config: MarketPipelineConfig
) -> Warehouse:
    """The scenario metered and rated once (dbt build per hour); treat as read-only."""
    path = tmp_path_factory.mktemp("billing") / "warehouse.duckdb"
    warehouse = build_scenario(path, billing_config, scenario())
    rate_hours(warehouse)
    return warehouse


@pytest.fixture()
def warehouse_copy(rated_warehouse: Warehouse, tmp_path: Path) -> Warehouse:
    """A private copy of the rated warehouse for tests that write."""
    target = tmp_path / "warehouse.duckdb"
    shutil.copy(rated_warehouse.path, target)
    return Warehouse(target)
