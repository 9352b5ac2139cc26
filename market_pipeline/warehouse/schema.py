"""The warehouse schema: versioned, idempotent migrations (DDL), applied in version order by
`Warehouse.migrate`. Only this module (and dbt) owns DDL."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


# Versioned DDL. Append only; never edit a released migration. Version ranges by concern:
# 1-99 core, 100-199 telemetry, 200-299 task drain, 300-399 billing, 400-499 market and
# forecast, 500-599 scaling, 600-699 simulation.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "core fleet, tasks, usage, prices, decisions, drain audit",
        (
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
        ),
    ),
    Migration(
        2,
        "pool demand snapshots and demand history",
        (
            """CREATE TABLE pool_demand_snapshots (
            ts TIMESTAMPTZ NOT NULL, pool_id VARCHAR NOT NULL, running_gpus DOUBLE NOT NULL,
            pending_gpus DOUBLE NOT NULL, gpus_on INTEGER NOT NULL, PRIMARY KEY (ts, pool_id))""",
            """CREATE TABLE demand_history (
            pool_id VARCHAR NOT NULL, ts TIMESTAMPTZ NOT NULL, running_gpus DOUBLE NOT NULL,
            pending_gpus DOUBLE NOT NULL, demand DOUBLE NOT NULL, price DOUBLE,
            PRIMARY KEY (pool_id, ts))""",
        ),
    ),
    Migration(
        3,
        "decisions: batch and claim of an executed action",
        (
            # The run that claimed the decision before carrying it out (exactly-once per decision
            # inside a batch run), when, and the batch (kind@tick) it ran in.
            "ALTER TABLE decisions ADD COLUMN batch_id VARCHAR",
            "ALTER TABLE decisions ADD COLUMN claimed_by VARCHAR",
            "ALTER TABLE decisions ADD COLUMN claimed_at TIMESTAMPTZ",
        ),
    ),
    Migration(
        4,
        "pool demand snapshots: the drainable work running and the guaranteed work waiting",
        (
            # What the rigid guarantee can back in a pool (`tick.promises.guarantee_reach`):
            # drains make room from drainable work for waiting guaranteed work. Null on rows
            # written before: not observed, read as a guarantee with nothing waiting.
            "ALTER TABLE pool_demand_snapshots ADD COLUMN drainable_running_gpus DOUBLE",
            "ALTER TABLE pool_demand_snapshots ADD COLUMN guaranteed_pending_gpus DOUBLE",
        ),
    ),
    Migration(
        400,
        "demand forecasts and solve reports",
        (
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
        ),
    ),
    Migration(
        401,
        "market ticks: published, solver and list prices with the reason",
        (
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
        ),
    ),
    Migration(
        500,
        "scaler memory between ticks",
        (
            """CREATE TABLE scaler_memory (
            pool_id VARCHAR PRIMARY KEY, memory JSON NOT NULL, updated_at TIMESTAMPTZ NOT NULL)""",
        ),
    ),
    Migration(
        100,
        "telemetry: clean samples, quarantine, ingest ledger, raw view",
        (
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
        ),
    ),
    Migration(
        101,
        "telemetry: fields a backend cannot measure are stored as null (not reported)",
        (
            # Slurm knows which GPU a job holds, not its power, temperature or memory used:
            # its adapter declares them unmeasured and validation lets exactly those nulls in
            # (hardware.protocol.unmeasured_fields); every other source still must report them.
            "ALTER TABLE telemetry_clean ALTER COLUMN mem_used_mib DROP NOT NULL",
            "ALTER TABLE telemetry_clean ALTER COLUMN power_w DROP NOT NULL",
            "ALTER TABLE telemetry_clean ALTER COLUMN temp_c DROP NOT NULL",
        ),
    ),
    Migration(
        200,
        "task drain billing events",
        (
            # One row per finished task drain (terminal audit state), written with that row:
            # the metering reads the drain signal time, the grace and who caused a failure here.
            """CREATE TABLE drain_billing_events (
            drain_id VARCHAR PRIMARY KEY, decision_id VARCHAR, task_id VARCHAR NOT NULL,
            tenant_id VARCHAR NOT NULL, pool_id VARCHAR, node_id VARCHAR,
            drain_signal_at TIMESTAMPTZ, grace_seconds DOUBLE NOT NULL,
            task_ended_at TIMESTAMPTZ, outcome VARCHAR NOT NULL,
            platform_fault BOOLEAN NOT NULL, reason VARCHAR, recorded_at TIMESTAMPTZ NOT NULL)""",
        ),
    ),
    Migration(
        210,
        "drain warning outbox: one row per drain whose warning step began",
        (
            # Written by the drain path in the transaction of the warning's begin row; the
            # webhook delivery worker reads it (the drain never waits on a receiver).
            "CREATE SEQUENCE drain_warning_outbox_seq START 1",
            """CREATE TABLE drain_warning_outbox (
            outbox_id BIGINT PRIMARY KEY DEFAULT nextval('drain_warning_outbox_seq'),
            drain_id VARCHAR NOT NULL UNIQUE, decision_id VARCHAR, tenant_id VARCHAR NOT NULL,
            task_id VARCHAR NOT NULL, node_id VARCHAR, pool_id VARCHAR, warned_at TIMESTAMPTZ NOT NULL,
            notice_seconds DOUBLE NOT NULL, expected_drain_at TIMESTAMPTZ NOT NULL,
            reasons VARCHAR[] NOT NULL, longer_notice VARCHAR NOT NULL)""",
        ),
    ),
    Migration(
        300,
        "billing rate card, accounts and ledger",
        (
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
        ),
    ),
    Migration(
        340,
        "billing capacity cost per GPU model",
        (
            # What a powered GPU-hour costs the platform, per GPU model (refreshed from the
            # config by `billing_rate_card`): agg_pool_economics prices capacity with it.
            """CREATE TABLE billing_rate_card_gpu_costs (
            gpu_model VARCHAR PRIMARY KEY, cost_per_gpu_hour DECIMAL(18, 6) NOT NULL)""",
        ),
    ),
    Migration(
        420,
        "demand response: the fit per pool x class per refit, with its diagnostics",
        (
            # One row per pool x class per refit (`demand_response` asset): the elasticity with
            # its interval, how it was fitted, and whether that pool x class runs a price experiment.
            """CREATE TABLE demand_response (
            fitted_at TIMESTAMPTZ NOT NULL, pool_id VARCHAR NOT NULL, resource_class VARCHAR NOT NULL,
            elasticity DOUBLE, elasticity_low DOUBLE, elasticity_high DOUBLE, interval_level DOUBLE NOT NULL,
            std_error DOUBLE, data_std_error DOUBLE, observations INTEGER NOT NULL, method VARCHAR NOT NULL,
            hour_bins INTEGER NOT NULL, price_spread DOUBLE NOT NULL, r2 DOUBLE, clusters INTEGER NOT NULL,
            reason VARCHAR NOT NULL, history_start TIMESTAMPTZ NOT NULL, history_end TIMESTAMPTZ NOT NULL,
            experiment VARCHAR NOT NULL, experiment_id VARCHAR,
            PRIMARY KEY (fitted_at, pool_id, resource_class))""",
        ),
    ),
    Migration(
        421,
        "price experiments: each tick's experiment price beside the tick's own, with its cost",
        (
            """CREATE TABLE price_experiments (
            tick_at TIMESTAMPTZ NOT NULL, experiment_id VARCHAR NOT NULL, pool_id VARCHAR NOT NULL,
            resource_class VARCHAR NOT NULL, sign INTEGER NOT NULL, amplitude DOUBLE NOT NULL,
            base_price DOUBLE NOT NULL, experiment_price DOUBLE NOT NULL, clipped_by VARCHAR NOT NULL,
            published BOOLEAN NOT NULL, estimated_cost_per_hour DOUBLE NOT NULL,
            PRIMARY KEY (tick_at, pool_id, resource_class))""",
        ),
    ),
    Migration(
        422,
        "demand response: the elasticity's daily cycle and the lag the fit used",
        (
            # e(h) = elasticity + elasticity_cos cos(2 pi h / 24) + elasticity_sin sin(...): what the
            # tick reads at the hour it prices (0, 0: no cycle, as every row fitted before)
            "ALTER TABLE demand_response ADD COLUMN IF NOT EXISTS elasticity_cos DOUBLE DEFAULT 0",
            "ALTER TABLE demand_response ADD COLUMN IF NOT EXISTS elasticity_sin DOUBLE DEFAULT 0",
            # the distributed lag's window in hours where the data showed deferred work, else 0
            "ALTER TABLE demand_response ADD COLUMN IF NOT EXISTS lag_hours DOUBLE DEFAULT 0",
        ),
    ),
    Migration(
        423,
        "market ticks: the capacity each pool can reach (an exhausted pool is told apart)",
        ("ALTER TABLE market_ticks ADD COLUMN IF NOT EXISTS reachable_gpus DOUBLE",),
    ),
    Migration(
        442,
        "market ticks: the tick's latency (wall seconds from its run's start to its prices published)",
        # NULL for a tick no Dagster run published (a direct write, a test)
        ("ALTER TABLE market_ticks ADD COLUMN IF NOT EXISTS tick_seconds DOUBLE",),
    ),
    Migration(
        446,
        "demand response: the low end of the prices each fit observed demand at",
        # the tick keeps the fitted representative's budget at its spend there (NULL: the
        # claims' budget alone, as every row fitted before)
        ("ALTER TABLE demand_response ADD COLUMN IF NOT EXISTS price_low DOUBLE",),
    ),
)


# -- the DuckLake dialect ------------------------------------------------------------------
# DuckLake has no PRIMARY KEY, UNIQUE, sequence or index: its tables are the same columns
# without them. Keys are kept by the writers (MERGE INTO on the key below); the ids a sequence
# handed out come from the table that records them (`LAKE_SEQUENCES`).
_INLINE_KEY = re.compile(r"\s+PRIMARY\s+KEY\b(?!\s*\()", re.IGNORECASE)
_TABLE_KEY = re.compile(r",\s*PRIMARY\s+KEY\s*\(([^)]*)\)", re.IGNORECASE)
_UNIQUE = re.compile(r"\s+UNIQUE\b(?!\s*\()", re.IGNORECASE)
_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\((.*)\)\s*$", re.I | re.S)
_SEQUENCE_DEFAULT = re.compile(r"\s+DEFAULT\s+nextval\('[^']*'\)", re.IGNORECASE)
_SKIPPED_IN_LAKE = re.compile(r"^\s*CREATE\s+(SEQUENCE|(UNIQUE\s+)?INDEX)\b", re.IGNORECASE)
# sequence -> (table, column) whose max + 1 is the next id in a lake
LAKE_SEQUENCES: dict[str, tuple[str, str]] = {"telemetry_ingest_seq": ("telemetry_ingests", "ingest_id")}


def lake_statement(statement: str) -> str | None:
    """`statement` in DuckLake's dialect: keys and uniqueness dropped; None for a statement
    DuckLake has no counterpart of (sequences, indexes)."""
    if _SKIPPED_IN_LAKE.match(statement):
        return None
    text = _TABLE_KEY.sub("", statement)
    text = _INLINE_KEY.sub("", text)
    text = _SEQUENCE_DEFAULT.sub("", text)  # the writer hands out the id (no sequence in a lake)
    return _UNIQUE.sub("", text)


def primary_keys(migrations: tuple[Migration, ...] = MIGRATIONS) -> dict[str, tuple[str, ...]]:
    """Each table's primary key columns, as the migrations declare them (the key a DuckLake
    writer merges on)."""
    keys: dict[str, tuple[str, ...]] = {}
    for migration in migrations:
        for statement in migration.statements:
            match = _CREATE_TABLE.match(statement.strip())
            if not match:
                continue
            table, body = match.group(1), match.group(2)
            composite = _TABLE_KEY.search(body)
            if composite:
                keys[table] = tuple(c.strip() for c in composite.group(1).split(","))
                continue
            for column in re.split(r",\s*(?![^()]*\))", body):
                if _INLINE_KEY.search(column):
                    keys[table] = (column.split()[0],)
    return keys
