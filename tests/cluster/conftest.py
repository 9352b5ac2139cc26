"""Cluster profile tests (the `lake` and `control_url` fixtures are the suite's, in
tests/conftest.py). The billing scenario (meter two hours, rate them with dbt) is shared with
tests/billing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "billing"))

import pytest  # noqa: E402


@pytest.fixture()
def control(control_url: str):  # noqa: ANN201 - a ControlStore, migrated
    from market_pipeline.warehouse.control import ControlStore

    store = ControlStore(control_url, retry_seconds=5.0)
    store.migrate()
    return store
