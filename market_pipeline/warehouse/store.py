"""The warehouse store: connections that wait out a lock, migrations, typed read/append helpers.

DuckDB allows one writing process. Writers are serialised by the Dagster pool `warehouse`
(limit 1); readers open read-only. Opening still retries on a lock conflict so that a
reader racing a writer (or two CLI calls) waits instead of losing work.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from market_pipeline.warehouse.schema import MIGRATIONS, Migration

LOCK_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class TableRewrite:
    """One table's share of `Warehouse.rewrite_tables`: delete rows matching `where_sql`
    (with `params`), then append `frame` (None: delete only)."""

    table: str
    where_sql: str
    params: tuple[object, ...] = ()
    frame: pl.DataFrame | pa.Table | None = None


class WarehouseError(RuntimeError):
    """A warehouse operation failed; the message names the table or query."""


def _is_lock_conflict(exc: duckdb.Error) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "being used" in text


@dataclass(frozen=True)
class Warehouse:
    path: Path
    # how long an open waits out another process's lock (the service asks for less)
    lock_retry_seconds: float = LOCK_RETRY_SECONDS
    lock_retry_max_delay: float = 1.0  # the wait between tries grows from 50 ms up to this

    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection; retries while another process holds the file lock."""
        if read_only and not self.path.exists():
            raise WarehouseError(f"warehouse {self.path} does not exist yet; run a writer first")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_retry_seconds
        delay = min(0.05, self.lock_retry_max_delay)
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.Error as exc:
                if not _is_lock_conflict(exc) or time.monotonic() > deadline:
                    raise WarehouseError(f"cannot open warehouse {self.path}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, self.lock_retry_max_delay)
        # Timestamps leave the warehouse as UTC (not the host's zone or "Etc/UTC").
        con.execute("SET TimeZone = 'UTC'")
        try:
            yield con
        finally:
            con.close()

    # -- schema -----------------------------------------------------------------------
    def migrate(self, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
        """Apply pending migrations in version order; return the versions applied."""
        with self.connect() as con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in con.execute("SELECT version FROM schema_migrations").fetchall()}
            applied = []
            for migration in sorted(migrations, key=lambda m: m.version):
                if migration.version in done:
                    continue
                con.execute("BEGIN")
                try:
                    for statement in migration.statements:
                        con.execute(statement)
                    con.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                        [migration.version, migration.name],
                    )
                    con.execute("COMMIT")
                except duckdb.Error as exc:
                    con.execute("ROLLBACK")
                    raise WarehouseError(
                        f"migration {migration.version} ({migration.name}) failed: {exc}"
                    ) from exc
                applied.append(migration.version)
        return applied

    def schema_version(self) -> int:
        with self.connect(read_only=True) as con:
            row = con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
        return int(row[0])

    # -- typed helpers ----------------------------------------------------------------
    def query(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame:
        """Run a read-only query and return a polars frame."""
        with self.connect(read_only=True) as con:
            try:
                return con.execute(sql, params or []).pl()
            except duckdb.Error as exc:
                raise WarehouseError(f"query failed: {exc}") from exc

    def append(
        self, table: str, frame: pl.DataFrame | pa.Table, con: duckdb.DuckDBPyConnection | None = None
    ) -> int:
        """Append rows by column name; return the count written."""
        arrow = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
        if arrow.num_rows == 0:
            return 0
        columns = ", ".join(f'"{name}"' for name in arrow.column_names)
        with self._maybe_connect(con) as c:
            c.register("_incoming", arrow)
            try:
                c.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _incoming")
            except duckdb.Error as exc:
                raise WarehouseError(f"append to {table} failed: {exc}") from exc
            finally:
                c.unregister("_incoming")
        return arrow.num_rows

    def replace_where(
        self, table: str, where_sql: str, params: Sequence[object], frame: pl.DataFrame | pa.Table
    ) -> int:
        """Atomically delete the rows matching `where_sql` and append `frame` (idempotent rewrite)."""
        with self.connect() as con:
            con.execute("BEGIN")
            try:
                con.execute(f"DELETE FROM {table} WHERE {where_sql}", list(params))
                written = self.append(table, frame, con=con)
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
        return written

    def rewrite_tables(
        self, rewrites: Sequence["TableRewrite"], con: duckdb.DuckDBPyConnection | None = None
    ) -> dict[str, int]:
        """Several tables' delete-then-append in one transaction (idempotent partition rewrite).

        All deletes run first, in the given order (a later delete may still read a table an
        earlier one rewrites, e.g. a ledger), then all appends. Returns rows written per table.
        """
        written: dict[str, int] = {}
        with self._maybe_connect(con) as c:
            c.execute("BEGIN")
            try:
                for step in rewrites:
                    try:
                        c.execute(f"DELETE FROM {step.table} WHERE {step.where_sql}", list(step.params))
                    except duckdb.Error as exc:
                        raise WarehouseError(f"delete from {step.table} failed: {exc}") from exc
                for step in rewrites:
                    count = 0 if step.frame is None else self.append(step.table, step.frame, con=c)
                    written[step.table] = written.get(step.table, 0) + count
                c.execute("COMMIT")
            except Exception:
                c.execute("ROLLBACK")
                raise
        return written

    def upsert(self, table: str, frame: pl.DataFrame | pa.Table) -> int:
        """INSERT OR REPLACE by the table's primary key."""
        arrow = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
        if arrow.num_rows == 0:
            return 0
        columns = ", ".join(f'"{name}"' for name in arrow.column_names)
        with self.connect() as con:
            con.register("_incoming", arrow)
            try:
                con.execute(f"INSERT OR REPLACE INTO {table} ({columns}) SELECT {columns} FROM _incoming")
            except duckdb.Error as exc:
                raise WarehouseError(f"upsert into {table} failed: {exc}") from exc
        return arrow.num_rows

    def execute(self, sql: str, params: Sequence[object] | None = None) -> None:
        """One write statement (DML only; DDL lives in migrations)."""
        with self.connect() as con:
            con.execute(sql, params or [])

    @contextlib.contextmanager
    def _maybe_connect(self, con: duckdb.DuckDBPyConnection | None) -> Iterator[duckdb.DuckDBPyConnection]:
        if con is not None:
            yield con
        else:
            with self.connect() as fresh:
                yield fresh


def open_warehouse(path: str | Path, migrate: bool = True) -> Warehouse:
    warehouse = Warehouse(Path(path))
    if migrate:
        warehouse.migrate()
    return warehouse
