"""The warehouse store: connections that wait out a lock, migrations, typed read/append helpers.

DuckDB allows one writing process. Writers are serialised by the Dagster pool `warehouse`
(limit 1); readers open read-only. Opening still retries on a lock conflict so that a
reader racing a writer (or two CLI calls) waits instead of losing work.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import duckdb
import polars as pl
import pyarrow as pa

from market_pipeline.file_lock import exclusive_lock
from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.errors import WarehouseError
from market_pipeline.warehouse.lake import (
    CATALOG_ALIAS,
    Lake,
    forget_instance,
    is_transaction_conflict,
    lake_instance,
)
from market_pipeline.warehouse.schema import (
    LAKE_SEQUENCES,
    MIGRATIONS,
    Migration,
    lake_statement,
    primary_keys,
)

LOCK_RETRY_SECONDS = 60.0
WRITE_LOCK_WAIT_SECONDS = 300.0  # a lake writer waits this long for another writer of its table
T = TypeVar("T")
_HELD = threading.local()  # the lake write locks this thread holds (a nested take is a no-op)


@dataclass(frozen=True)
class TableRewrite:
    """One table's share of `Warehouse.rewrite_tables`: delete rows matching `where_sql`
    (with `params`), then append `frame` (None: delete only)."""

    table: str
    where_sql: str
    params: tuple[object, ...] = ()
    frame: pl.DataFrame | pa.Table | None = None


def _is_lock_conflict(exc: duckdb.Error) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "being used" in text


@dataclass(frozen=True)
class Warehouse:
    """The warehouse: the DuckDB file at `path` (the embedded default), or, with `lake`, a
    DuckLake (catalog in PostgreSQL, Parquet data; `path` is then unused)."""

    path: Path
    # how long an open waits out another process's lock (the service asks for less)
    lock_retry_seconds: float = LOCK_RETRY_SECONDS
    lock_retry_max_delay: float = 1.0  # the wait between tries grows from 50 ms up to this
    lake: Lake | None = None
    # the cluster profile's control state (claims, drain journal) in PostgreSQL; None: in
    # the warehouse's own tables (the embedded default)
    control: ControlStore | None = None

    @property
    def location(self) -> str:
        """Where the warehouse is, for messages and reports."""
        return self.lake.describe() if self.lake is not None else str(self.path)

    def exists(self) -> bool:
        """Whether there is a warehouse to read (a lake's catalog is created on first open)."""
        return self.lake is not None or self.path.exists()

    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection; retries while another process holds the file lock."""
        if self.lake is not None:
            with self._lake_connection() as con:
                yield con
            return
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

    @contextlib.contextmanager
    def _lake_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor (its own transaction) on this process's instance of the lake."""
        assert self.lake is not None
        try:
            cursor = lake_instance(self.lake).cursor()
            cursor.execute(f"USE {CATALOG_ALIAS}")
            cursor.execute("SET TimeZone = 'UTC'")
        except duckdb.Error as exc:  # the catalog's connection broke (PostgreSQL restarted)
            forget_instance(self.lake)
            try:
                cursor = lake_instance(self.lake).cursor()
                cursor.execute(f"USE {CATALOG_ALIAS}")
                cursor.execute("SET TimeZone = 'UTC'")
            except duckdb.Error:
                raise WarehouseError(
                    f"cannot reach the warehouse's PostgreSQL ({self.lake.describe()}): {exc}"
                ) from exc
        try:
            yield cursor
        finally:
            cursor.close()

    @contextlib.contextmanager
    def write_lock(self, *tables: str) -> Iterator[None]:
        """On a lake, the block is the only writer of `tables` (on any machine): it holds a
        PostgreSQL advisory lock `lake:<table>` per table on the lake's catalog, taken in name
        order, dropped by the server if this process dies. A lake has no primary key, and two
        transactions that add one key both commit (a replace of a key with no rows yet deletes
        nothing, so nothing conflicts): writers of a keyed table take turns instead. A DuckDB
        file has one writer already: nothing to hold."""
        held: set[str] = _HELD.__dict__.setdefault("names", set())
        names = sorted({f"lake:{table}" for table in tables} - held)
        if self.lake is None or not names:
            yield
            return
        locks = ControlStore(self.lake.catalog)
        with contextlib.ExitStack() as stack:
            for name in names:
                stack.enter_context(locks.lock(name, WRITE_LOCK_WAIT_SECONDS))
                held.add(name)
                stack.callback(held.discard, name)
            yield

    @contextlib.contextmanager
    def exclusive(self, name: str, wait_seconds: float) -> Iterator[None]:
        """The block is the only holder of `name` among every process that shares this
        warehouse; after `wait_seconds` of another holder, WarehouseError (LockBusy) names it.

        A read-then-write that must see every earlier one (a plan spending the disruption
        budget) holds it, since neither store makes that atomic: on the cluster profile an
        advisory lock in the control PostgreSQL (or the lake's catalog), which the server drops
        if the holder dies; on a DuckDB file an exclusive `flock` on a file beside it (the file
        has one writer at a time, but a read and the write after it are two connections, and
        another process's write can come between them)."""
        locks = self.control
        if locks is None and self.lake is not None:
            locks = ControlStore(self.lake.catalog)
        if locks is not None:
            with locks.lock(name, wait_seconds):
                yield
            return
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
        beside = self.path.with_name(f"{self.path.name}.{safe}.lock")

        def busy() -> Exception:
            return WarehouseError(f"{name} is held by another process ({beside}) after {wait_seconds:g} s")

        with exclusive_lock(beside, wait_seconds, busy):
            yield

    def retrying(self, operation: Callable[[], T]) -> T:
        """Run `operation` (one whole transaction), again while a lake's commit loses to a
        concurrent writer ("Transaction conflict"); a DuckDB file runs it once."""
        if self.lake is None:
            return operation()
        delay = 0.02
        deadline = time.monotonic() + LOCK_RETRY_SECONDS
        while True:
            try:
                return operation()
            except (duckdb.Error, WarehouseError) as exc:
                if not is_transaction_conflict(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)

    # -- schema -----------------------------------------------------------------------
    def migrate(self, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
        """Apply pending migrations in version order; return the versions applied."""
        return self.retrying(lambda: self._migrate(migrations))

    def _migrate(self, migrations: Sequence[Migration]) -> list[int]:
        key = "" if self.lake is not None else " PRIMARY KEY"
        with self.connect() as con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                f" version INTEGER{key}, name VARCHAR NOT NULL,"
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
                        text = statement if self.lake is None else lake_statement(statement)
                        if text is not None:
                            con.execute(text)
                    con.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                        [migration.version, migration.name],
                    )
                    con.execute("COMMIT")
                except duckdb.Error as exc:
                    rollback(con)
                    raise_unless_conflict(exc, f"migration {migration.version} ({migration.name}) failed")
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
        with self.write_lock(table):
            return self.retrying(lambda: self._replace_where(table, where_sql, params, frame))

    def _replace_where(
        self, table: str, where_sql: str, params: Sequence[object], frame: pl.DataFrame | pa.Table
    ) -> int:
        with self.connect() as con:
            con.execute("BEGIN")
            try:
                con.execute(f"DELETE FROM {table} WHERE {where_sql}", list(params))
                written = self.append(table, frame, con=con)
                con.execute("COMMIT")
            except Exception:
                rollback(con)
                raise
        return written

    def rewrite_tables(
        self, rewrites: Sequence["TableRewrite"], con: duckdb.DuckDBPyConnection | None = None
    ) -> dict[str, int]:
        """Several tables' delete-then-append in one transaction (idempotent partition rewrite).

        All deletes run first, in the given order (a later delete may still read a table an
        earlier one rewrites, e.g. a ledger), then all appends. Returns rows written per table.
        On a lake, a transaction that loses to a concurrent writer is retried when this call
        owns the connection (a caller's `con` retries its own whole transaction).
        """
        with self.write_lock(*(step.table for step in rewrites)):  # a caller's `con`: taken before it
            if con is not None:
                return self._rewrite_tables(rewrites, con)
            return self.retrying(lambda: self._rewrite_tables(rewrites, None))

    def _rewrite_tables(
        self, rewrites: Sequence["TableRewrite"], con: duckdb.DuckDBPyConnection | None
    ) -> dict[str, int]:
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
                rollback(c)
                raise
        return written

    def upsert(self, table: str, frame: pl.DataFrame | pa.Table) -> int:
        """INSERT OR REPLACE by the table's primary key (on a lake: MERGE INTO on that key)."""
        arrow = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
        if arrow.num_rows == 0:
            return 0
        columns = ", ".join(f'"{name}"' for name in arrow.column_names)
        if self.lake is None:
            sql = f"INSERT OR REPLACE INTO {table} ({columns}) SELECT {columns} FROM _incoming"
        else:
            sql = _merge_sql(table, arrow.column_names, update=True)

        def write() -> int:
            with self.connect() as con:
                con.register("_incoming", arrow)
                try:
                    con.execute(sql)
                except duckdb.Error as exc:
                    raise_unless_conflict(exc, f"upsert into {table} failed")
                finally:
                    con.unregister("_incoming")
            return arrow.num_rows

        with self.write_lock(table):
            return self.retrying(write)

    def insert_new(
        self,
        con: duckdb.DuckDBPyConnection,
        table: str,
        columns: Sequence[str],
        source: str,
        params: Sequence[object] = (),
    ) -> None:
        """Insert the rows of `source` (a SELECT or VALUES yielding `columns`) whose key is not
        in `table` yet (ON CONFLICT DO NOTHING; on a lake, MERGE INTO ... WHEN NOT MATCHED)."""
        names = ", ".join(columns)
        if self.lake is None:
            con.execute(f"INSERT INTO {table} ({names}) {source} ON CONFLICT DO NOTHING", list(params))
            return
        rows = f"(SELECT * FROM ({source}) AS n({names}))"
        con.execute(_merge_sql(table, columns, update=False, source=rows), list(params))

    def next_id(self, con: duckdb.DuckDBPyConnection, sequence: str) -> int:
        """The next value of `sequence` (on a lake: one past the largest id its table records)."""
        if self.lake is None:
            return int(con.execute(f"SELECT nextval('{sequence}')").fetchone()[0])
        table, column = LAKE_SEQUENCES[sequence]
        return int(con.execute(f"SELECT coalesce(max({column}), 0) + 1 FROM {table}").fetchone()[0])

    def execute(self, sql: str, params: Sequence[object] | None = None) -> None:
        """One write statement (DML only; DDL lives in migrations)."""

        def run() -> None:
            with self.connect() as con:
                con.execute(sql, params or [])

        self.retrying(run)

    @contextlib.contextmanager
    def _maybe_connect(self, con: duckdb.DuckDBPyConnection | None) -> Iterator[duckdb.DuckDBPyConnection]:
        if con is not None:
            yield con
        else:
            with self.connect() as fresh:
                yield fresh


def raise_unless_conflict(exc: duckdb.Error, what: str) -> NoReturn:
    """Inside an `except duckdb.Error`: a lake's lost commit ("Transaction conflict") propagates
    as it is, for `Warehouse.retrying` to run the transaction again; anything else is one
    WarehouseError line, `what` first."""
    if is_transaction_conflict(exc):
        raise exc
    raise WarehouseError(f"{what}: {exc}") from exc


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back if a transaction is still open (a failed COMMIT has already ended it)."""
    with contextlib.suppress(duckdb.Error):
        con.execute("ROLLBACK")


def _merge_sql(table: str, columns: Sequence[str], *, update: bool, source: str = "_incoming") -> str:
    """MERGE INTO `table` from `source` on the table's primary key: new keys inserted, existing
    ones updated (`update`) or left alone."""
    key = primary_keys().get(table)
    if not key:
        raise WarehouseError(f"{table} has no key to merge on")
    on = " AND ".join(f't."{c}" IS NOT DISTINCT FROM s."{c}"' for c in key)
    names = ", ".join(f'"{c}"' for c in columns)
    values = ", ".join(f's."{c}"' for c in columns)
    sql = (
        f"MERGE INTO {table} AS t USING (SELECT DISTINCT ON ({', '.join(key)}) * FROM {source}) AS s ON {on} "
    )
    if update:
        sets = ", ".join(f'"{c}" = s."{c}"' for c in columns if c not in key)
        if sets:
            sql += f"WHEN MATCHED THEN UPDATE SET {sets} "
    return sql + f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})"


def open_warehouse(
    path: str | Path, migrate: bool = True, lake: Lake | None = None, control: ControlStore | None = None
) -> Warehouse:
    warehouse = Warehouse(Path(path), lake=lake, control=control)
    if migrate:
        warehouse.migrate()
        if control is not None:
            control.migrate()
    return warehouse
