"""Dagster's PostgreSQL storage with one connection pool per process (the cluster profile's
instance, `storage: custom:` in dagster.cluster.yaml and dagster.k8s.yaml).

dagster-postgres opens a new PostgreSQL connection for every storage operation (SQLAlchemy's
NullPool, so that short-lived instances keep nothing open), and a dagster-celery worker builds a
new instance for every step. Measured on `bench scale` (two lanes, six nodes, 2026-12-06), the
Dagster database took about 700 connections per tick, and the PostgreSQL server spent 5.15
CPU-seconds per tick, nearly as much as the worker running the tick's steps (6.73): a new
backend process per connection, its catalog caches filled anew. Here every instance of a
process shares one pooled engine per database URL (a few connections, reused), so a worker's
steps and a run worker's events ride on the same connections: 2.0 CPU-seconds per tick, at most
9 connections to the Dagster database at once (measured with 4 extra connections allowed; now
10). The webserver still swaps in its own pool
(`optimize_for_webserver`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import create_pg_engine, get_token_provider_from_config, pg_url_from_config

# per process: a pool's connections are not shared with a forked child
_ENGINES: dict[tuple[int, str], Any] = {}
_LOCK = threading.Lock()
POOL_SIZE = 2  # kept open per process and database
MAX_OVERFLOW = (
    10  # opened beyond those while more threads need one at once (a daemon has several), then closed
)
POOL_RECYCLE_S = 3600


def shared_engine(postgres_url: str) -> Any:  # noqa: ANN401 - a SQLAlchemy Engine
    """This process's pooled engine for `postgres_url` (made on first use)."""
    key = (os.getpid(), postgres_url)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = create_pg_engine(
                postgres_url,
                isolation_level="AUTOCOMMIT",
                pool_size=POOL_SIZE,
                max_overflow=MAX_OVERFLOW,
                pool_recycle=POOL_RECYCLE_S,
                pool_pre_ping=True,  # a connection the server closed (restart) is replaced, not used
            )
            _ENGINES[key] = engine
        return engine


class PooledPostgresStorage(DagsterPostgresStorage):
    """`storage: postgres:` with its run, event log and schedule storages on `shared_engine`.
    Same config (postgres_url or postgres_db, should_autocreate_tables); no token provider."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
    ) -> None:
        super().__init__(postgres_url, should_autocreate_tables, inst_data)
        engine = shared_engine(postgres_url)
        for storage in (self._run_storage, self._event_log_storage, self._schedule_storage):
            storage._engine.dispose()
            storage._engine = engine

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledPostgresStorage:
        if get_token_provider_from_config(config_value) is not None:
            raise ValueError("PooledPostgresStorage: auth_provider is not supported; use postgres:")
        return cls(
            pg_url_from_config(config_value),
            bool(config_value.get("should_autocreate_tables", True)),
            inst_data,
        )
