"""Cluster profile tests (the `lake` fixture is the suite's, in tests/conftest.py). The billing
scenario (meter two hours, rate them with dbt) is shared with tests/billing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "billing"))


import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


@pytest.fixture()
def control_url() -> Iterator[str]:
    """A fresh PostgreSQL database on 127.0.0.1:5432 for the control state, dropped
    afterwards; skips when PostgreSQL is not running there."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = psycopg2.connect(ADMIN_DSN, connect_timeout=3)
    except psycopg2.OperationalError:
        pytest.skip("PostgreSQL is not running on 127.0.0.1:5432")
    admin.autocommit = True
    name = f"cluster_helper_ctl_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        yield f"host=127.0.0.1 port=5432 user=postgres dbname={name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture()
def control(control_url: str):  # noqa: ANN201 - a ControlStore, migrated
    from market_pipeline.warehouse.control import ControlStore

    store = ControlStore(control_url, retry_seconds=5.0)
    store.migrate()
    return store
