"""A throwaway PostgreSQL database: made under a unique name on a server's admin connection,
and dropped after (its sessions ended first). The soak's Dagster storage and the benches'
lake catalogs live in one each."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def scratch_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A database named `prefix` and a random suffix on the server of `admin_url` (a
    `postgresql://` URL): yields its SQLAlchemy URL (`postgresql+psycopg2://`), drops it after."""
    import psycopg2

    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(admin_url)
    admin.autocommit = True
    try:
        admin.cursor().execute(f"CREATE DATABASE {name}")
        yield admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1) + f"/{name}"
    finally:
        cursor = admin.cursor()
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()
