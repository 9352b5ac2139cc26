"""The DuckDB warehouse: schema, versioned idempotent migrations, typed read/append helpers.

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

LOCK_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


# Versioned DDL. Append only; never edit a released migration. Version ranges by concern:
# 1-99 core, 100-199 telemetry, 200-299 task drain, 300-399 billing, 400-499 market and
# forecast, 500-599 scaling, 600-699 simulation.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "core fleet, tasks, usage, prices, decisions, drain audit", (
        """CREATE TABLE fleet_nodes (
            node_id VARCHAR PRIMARY KEY, pool_id VARCHAR NOT NULL, gpu_model VARCHAR NOT NULL,
            zone VARCHAR NOT NULL, gpus INTEGER NOT NULL, state VARCHAR NOT NULL,
            cordoned BOOLEAN NOT NULL DEFAULT false, nvlink BOOLEAN NOT NULL DEFAULT false,
            observed_at TIMESTAMPTZ NOT NULL)""",
        """CREATE TABLE fleet_gpus (
            gpu_uuid VARCHAR PRIMARY KEY, node_id VARCHAR NOT NULL, gpu_index INTEGER NOT NULL,
            gpu_model VARCHAR NOT NULL, memory_total_mib INTEGER NOT NULL,
            mig_profile VARCHAR, nvlink_peers VARCHAR[], observed_at TIMESTAMPTZ NOT NULL)""",
        """CREATE TABLE tasks (
            task_id VARCHAR PRIMARY KEY, tenant_id VARCHAR NOT NULL, pool_id VARCHAR NOT NULL,
            node_id VARCHAR NOT NULL, gpu_uuids VARCHAR[] NOT NULL, gpu_milli INTEGER NOT NULL,
            kind VARCHAR NOT NULL, qos VARCHAR NOT NULL, priority INTEGER NOT NULL,
            resource_class VARCHAR NOT NULL, mem_mib INTEGER NOT NULL, mig_profile VARCHAR,
            do_not_drain BOOLEAN NOT NULL, checkpointable BOOLEAN NOT NULL, pid INTEGER,
            started_at TIMESTAMPTZ NOT NULL, last_seen_at TIMESTAMPTZ NOT NULL,
            ended_at TIMESTAMPTZ, end_reason VARCHAR)""",
        """CREATE TABLE usage_intervals (
            interval_id VARCHAR PRIMARY KEY, task_id VARCHAR NOT NULL, tenant_id VARCHAR NOT NULL,
            pool_id VARCHAR NOT NULL, gpu_model VARCHAR NOT NULL, zone VARCHAR NOT NULL,
            resource_class VARCHAR NOT NULL, node_id VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL,
            gpu_fraction DECIMAL(6, 4) NOT NULL, mig_profile VARCHAR, mem_mib INTEGER NOT NULL,
            started_at TIMESTAMPTZ NOT NULL, ended_at TIMESTAMPTZ NOT NULL,
            end_reason VARCHAR NOT NULL, drain_signal_at TIMESTAMPTZ,
            platform_fault BOOLEAN NOT NULL DEFAULT false, partition_key VARCHAR NOT NULL)""",
        """CREATE TABLE price_book (
            effective_from TIMESTAMPTZ NOT NULL, pool_id VARCHAR NOT NULL,
            gpu_model VARCHAR NOT NULL, zone VARCHAR NOT NULL, resource_class VARCHAR NOT NULL,
            price_per_gpu_hour DECIMAL(18, 6) NOT NULL, solve_id VARCHAR NOT NULL,
            source VARCHAR NOT NULL, PRIMARY KEY (effective_from, pool_id, resource_class))""",
        """CREATE TABLE decisions (
            decision_id VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL, pool_id VARCHAR,
            target VARCHAR, action VARCHAR NOT NULL, allowed BOOLEAN NOT NULL,
            shadow BOOLEAN NOT NULL, reasons VARCHAR[] NOT NULL, inputs JSON,
            decided_at TIMESTAMPTZ NOT NULL, executed_at TIMESTAMPTZ, outcome VARCHAR)""",
        """CREATE TABLE drain_audit (
            drain_id VARCHAR NOT NULL, seq INTEGER NOT NULL, state VARCHAR NOT NULL,
            recorded_at TIMESTAMPTZ NOT NULL, task_id VARCHAR, node_id VARCHAR, tenant_id VARCHAR,
            detail JSON, PRIMARY KEY (drain_id, seq))""",
        """CREATE TABLE tick_log (
            tick_id VARCHAR PRIMARY KEY, started_at TIMESTAMPTZ NOT NULL,
            simulated_until TIMESTAMPTZ NOT NULL, samples INTEGER NOT NULL,
            tasks INTEGER NOT NULL, mean_sm_util_pct DOUBLE)""",
    )),
)


class WarehouseError(RuntimeError):
    """A warehouse operation failed; the message names the table or query."""


def _is_lock_conflict(exc: duckdb.Error) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "being used" in text


@dataclass(frozen=True)
class Warehouse:
    path: Path

    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection; retries while another process holds the file lock."""
        if read_only and not self.path.exists():
            raise WarehouseError(f"warehouse {self.path} does not exist yet; run a writer first")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + LOCK_RETRY_SECONDS
        delay = 0.05
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.Error as exc:
                if not _is_lock_conflict(exc) or time.monotonic() > deadline:
                    raise WarehouseError(f"cannot open warehouse {self.path}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
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

    def append(self, table: str, frame: pl.DataFrame | pa.Table,
               con: duckdb.DuckDBPyConnection | None = None) -> int:
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

    def replace_where(self, table: str, where_sql: str, params: Sequence[object],
                      frame: pl.DataFrame | pa.Table) -> int:
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

    def upsert(self, table: str, frame: pl.DataFrame | pa.Table) -> int:
        """INSERT OR REPLACE by the table's primary key."""
        arrow = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
        if arrow.num_rows == 0:
            return 0
        columns = ", ".join(f'"{name}"' for name in arrow.column_names)
        with self.connect() as con:
            con.register("_incoming", arrow)
            try:
                con.execute(
                    f"INSERT OR REPLACE INTO {table} ({columns}) SELECT {columns} FROM _incoming"
                )
            except duckdb.Error as exc:
                raise WarehouseError(f"upsert into {table} failed: {exc}") from exc
        return arrow.num_rows

    def execute(self, sql: str, params: Sequence[object] | None = None) -> None:
        """One write statement (DML only; DDL lives in migrations)."""
        with self.connect() as con:
            con.execute(sql, params or [])

    @contextlib.contextmanager
    def _maybe_connect(self, con: duckdb.DuckDBPyConnection | None
                       ) -> Iterator[duckdb.DuckDBPyConnection]:
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
