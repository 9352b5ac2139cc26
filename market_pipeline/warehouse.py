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
    )),
    Migration(2, "pool demand snapshots and demand history", (
        """CREATE TABLE pool_demand_snapshots (
            ts TIMESTAMPTZ NOT NULL, pool_id VARCHAR NOT NULL, running_gpus DOUBLE NOT NULL,
            pending_gpus DOUBLE NOT NULL, gpus_on INTEGER NOT NULL, PRIMARY KEY (ts, pool_id))""",
        """CREATE TABLE demand_history (
            pool_id VARCHAR NOT NULL, ts TIMESTAMPTZ NOT NULL, running_gpus DOUBLE NOT NULL,
            pending_gpus DOUBLE NOT NULL, demand DOUBLE NOT NULL, price DOUBLE,
            PRIMARY KEY (pool_id, ts))""",
    )),
    Migration(3, "decisions: batch and claim of an executed action", (
        # The run that claimed the decision before carrying it out (exactly-once per decision
        # inside a batch run), when, and the batch (kind@tick) it ran in.
        "ALTER TABLE decisions ADD COLUMN batch_id VARCHAR",
        "ALTER TABLE decisions ADD COLUMN claimed_by VARCHAR",
        "ALTER TABLE decisions ADD COLUMN claimed_at TIMESTAMPTZ",
    )),
    Migration(400, "demand forecasts and solve reports", (
        """CREATE TABLE demand_forecasts (
            pool_id VARCHAR NOT NULL, origin_ts TIMESTAMPTZ NOT NULL, target_ts TIMESTAMPTZ NOT NULL,
            horizon_min INTEGER NOT NULL, q10 DOUBLE NOT NULL, q50 DOUBLE NOT NULL,
            q90 DOUBLE NOT NULL, model VARCHAR NOT NULL, model_version VARCHAR NOT NULL,
            validation_mae DOUBLE, fallback_reason VARCHAR,
            PRIMARY KEY (pool_id, origin_ts, target_ts))""",
        """CREATE TABLE solve_reports (
            solve_id VARCHAR PRIMARY KEY, solved_at TIMESTAMPTZ NOT NULL, status VARCHAR NOT NULL,
            converged BOOLEAN NOT NULL, profit DOUBLE, kkt_residual DOUBLE, iterations INTEGER,
            seconds DOUBLE, fallback_reason VARCHAR, shadow BOOLEAN NOT NULL, report JSON NOT NULL)""",
    )),
    Migration(401, "market ticks: published, solver and list prices with the reason", (
        "ALTER TABLE price_book ADD COLUMN list_price_per_gpu_hour DECIMAL(18, 6)",
        "ALTER TABLE price_book ADD COLUMN solver_price_per_gpu_hour DECIMAL(18, 6)",
        "ALTER TABLE price_book ADD COLUMN intervention_reason VARCHAR",
        # One row per pool and tick: what the market tick published and why.
        """CREATE TABLE market_ticks (
            tick_at TIMESTAMPTZ NOT NULL, solve_id VARCHAR NOT NULL, pool_id VARCHAR NOT NULL,
            status VARCHAR NOT NULL, list_price DOUBLE NOT NULL, solver_guaranteed DOUBLE NOT NULL,
            solver_drainable DOUBLE NOT NULL, guaranteed DOUBLE NOT NULL, drainable DOUBLE NOT NULL,
            guaranteed_reason VARCHAR NOT NULL, drainable_reason VARCHAR NOT NULL,
            certified BOOLEAN NOT NULL, margin DOUBLE NOT NULL, required_margin DOUBLE NOT NULL,
            serving_gpus DOUBLE NOT NULL, capacity_target_gpus DOUBLE NOT NULL,
            equilibrium_price DOUBLE NOT NULL, shield_factor DOUBLE NOT NULL, demand_gpus DOUBLE NOT NULL,
            backlog_gpus DOUBLE NOT NULL, forecast_upper_gpus DOUBLE NOT NULL, shadow BOOLEAN NOT NULL,
            PRIMARY KEY (tick_at, pool_id))""",
    )),
    Migration(500, "scaler memory between ticks", (
        """CREATE TABLE scaler_memory (
            pool_id VARCHAR PRIMARY KEY, memory JSON NOT NULL, updated_at TIMESTAMPTZ NOT NULL)""",
    )),
    Migration(100, "telemetry: clean samples, quarantine, ingest ledger, raw view", (
        # Clean samples, typed per SAMPLE_SCHEMA. No primary key: uniqueness of
        # (node_id, gpu_uuid, ts) is enforced by validation and re-checked by the asset checks
        # (an index would halve ingest throughput at fleet scale).
        """CREATE TABLE telemetry_clean (
            ts TIMESTAMPTZ NOT NULL, node_id VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL,
            gpu_index INTEGER NOT NULL, sm_util_pct DOUBLE NOT NULL, mem_used_mib DOUBLE NOT NULL,
            mem_total_mib DOUBLE NOT NULL, power_w DOUBLE NOT NULL, temp_c DOUBLE NOT NULL,
            mig_profile VARCHAR, task_id VARCHAR, tenant_id VARCHAR, xid_errors INTEGER,
            partition_key VARCHAR NOT NULL, ingest_id BIGINT NOT NULL)""",
        # Rejected rows exactly as read (text), their 1-based position in the input and why.
        """CREATE TABLE telemetry_quarantine (
            source_row BIGINT NOT NULL, ts VARCHAR, node_id VARCHAR, gpu_uuid VARCHAR,
            gpu_index VARCHAR, sm_util_pct VARCHAR, mem_used_mib VARCHAR, mem_total_mib VARCHAR,
            power_w VARCHAR, temp_c VARCHAR, mig_profile VARCHAR, task_id VARCHAR,
            tenant_id VARCHAR, xid_errors VARCHAR, reasons VARCHAR[] NOT NULL,
            partition_key VARCHAR NOT NULL, ingest_id BIGINT NOT NULL)""",
        # Ingest ids: an integer per ingest (a per-row UUID string cost ~10% of ingest time).
        "CREATE SEQUENCE telemetry_ingest_seq START 1",
        # One row per (partition, source): what the last ingest of that source read into the
        # partition. rows_in is counted before validation, so raw = clean + quarantined is a
        # real check against the two tables, not a tautology.
        """CREATE TABLE telemetry_ingests (
            partition_key VARCHAR NOT NULL, source VARCHAR NOT NULL, ingest_id BIGINT NOT NULL,
            rows_in BIGINT NOT NULL, clean BIGINT NOT NULL, quarantined BIGINT NOT NULL,
            by_reason JSON NOT NULL, ingested_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (partition_key, source))""",
        # Every landed row with its fate; clean rows are shown in their parsed form.
        """CREATE VIEW telemetry_raw AS
            SELECT c.partition_key, c.ingest_id, i.source, 'clean' AS status,
                CAST(c.ts AS VARCHAR) AS ts, c.node_id, c.gpu_uuid,
                CAST(c.gpu_index AS VARCHAR) AS gpu_index,
                CAST(c.sm_util_pct AS VARCHAR) AS sm_util_pct,
                CAST(c.mem_used_mib AS VARCHAR) AS mem_used_mib,
                CAST(c.mem_total_mib AS VARCHAR) AS mem_total_mib,
                CAST(c.power_w AS VARCHAR) AS power_w, CAST(c.temp_c AS VARCHAR) AS temp_c,
                c.mig_profile, c.task_id, c.tenant_id, CAST(c.xid_errors AS VARCHAR) AS xid_errors,
                CAST([] AS VARCHAR[]) AS reasons
            FROM telemetry_clean c JOIN telemetry_ingests i
                ON i.partition_key = c.partition_key AND i.ingest_id = c.ingest_id
            UNION ALL
            SELECT q.partition_key, q.ingest_id, i.source, 'quarantined', q.ts, q.node_id,
                q.gpu_uuid, q.gpu_index, q.sm_util_pct, q.mem_used_mib, q.mem_total_mib,
                q.power_w, q.temp_c, q.mig_profile, q.task_id, q.tenant_id, q.xid_errors,
                q.reasons
            FROM telemetry_quarantine q JOIN telemetry_ingests i
                ON i.partition_key = q.partition_key AND i.ingest_id = q.ingest_id""",
    )),
    Migration(200, "task drain billing events", (
        # One row per finished task drain (terminal audit state), written with that row:
        # the metering reads the drain signal time, the grace and who caused a failure here.
        """CREATE TABLE drain_billing_events (
            drain_id VARCHAR PRIMARY KEY, decision_id VARCHAR, task_id VARCHAR NOT NULL,
            tenant_id VARCHAR NOT NULL, pool_id VARCHAR, node_id VARCHAR,
            drain_signal_at TIMESTAMPTZ, grace_seconds DOUBLE NOT NULL,
            task_ended_at TIMESTAMPTZ, outcome VARCHAR NOT NULL,
            platform_fault BOOLEAN NOT NULL, reason VARCHAR, recorded_at TIMESTAMPTZ NOT NULL)""",
    )),
    Migration(300, "billing rate card, accounts and ledger", (
        # Rate card: refreshed from the typed config by the `billing_rate_card` asset.
        """CREATE TABLE billing_rate_card_time (
            day_of_week INTEGER NOT NULL, hour_of_day INTEGER NOT NULL, band VARCHAR NOT NULL,
            coefficient DECIMAL(9, 6) NOT NULL, PRIMARY KEY (day_of_week, hour_of_day))""",
        """CREATE TABLE billing_rate_card_zones (
            zone VARCHAR PRIMARY KEY, location_coefficient DECIMAL(9, 6) NOT NULL)""",
        """CREATE TABLE billing_rate_card_pools (
            pool_id VARCHAR PRIMARY KEY, gpu_model VARCHAR NOT NULL, zone VARCHAR NOT NULL,
            base_price_per_gpu_hour DECIMAL(18, 6) NOT NULL, price_min DECIMAL(18, 6) NOT NULL,
            price_max DECIMAL(18, 6) NOT NULL, gpu_memory_mib INTEGER NOT NULL)""",
        """CREATE TABLE billing_commitment_tiers (
            min_gpu_hours DECIMAL(18, 6) PRIMARY KEY, discount DECIMAL(9, 6) NOT NULL)""",
        """CREATE TABLE billing_terms (
            currency VARCHAR NOT NULL, grace_seconds INTEGER NOT NULL,
            sla_credit_rate DECIMAL(9, 6) NOT NULL, sla_credit_window_seconds INTEGER NOT NULL,
            drainable_default_discount DECIMAL(9, 6) NOT NULL, refreshed_at TIMESTAMPTZ NOT NULL)""",
        # Accounts: only tenants with a row are budget-guarded (prepaid balance and/or caps).
        """CREATE TABLE billing_accounts (
            tenant_id VARCHAR PRIMARY KEY, prepaid BOOLEAN NOT NULL,
            credit_limit DECIMAL(20, 9) NOT NULL DEFAULT 0, hard_cap_daily DECIMAL(20, 9),
            hard_cap_monthly DECIMAL(20, 9), updated_at TIMESTAMPTZ NOT NULL)""",
        # Ledger: amount > 0 adds to the balance (top-up, SLA credit), < 0 debits (usage).
        """CREATE TABLE billing_ledger (
            entry_id VARCHAR PRIMARY KEY, tenant_id VARCHAR NOT NULL, kind VARCHAR NOT NULL,
            amount DECIMAL(20, 9) NOT NULL, period_start TIMESTAMPTZ,
            recorded_at TIMESTAMPTZ NOT NULL, reference VARCHAR)""",
    )),
    Migration(340, "billing capacity cost per GPU model", (
        # What a powered GPU-hour costs the platform, per GPU model (refreshed from the
        # config by `billing_rate_card`): agg_pool_economics prices capacity with it.
        """CREATE TABLE billing_rate_card_gpu_costs (
            gpu_model VARCHAR PRIMARY KEY, cost_per_gpu_hour DECIMAL(18, 6) NOT NULL)""",
    )),
)


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

    def rewrite_tables(self, rewrites: Sequence["TableRewrite"],
                       con: duckdb.DuckDBPyConnection | None = None) -> dict[str, int]:
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
                        c.execute(f"DELETE FROM {step.table} WHERE {step.where_sql}",
                                  list(step.params))
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
