"""Typed readers of what the HTTP service shows (market_pipeline/service/): prices, the
tenant's own billing rows and drains, the operator's timelines, and the numbers /metrics
exports. Every reader opens the warehouse read-only for one query and bounds its rows.

Tenant readers take the tenant id and filter on the column that names a row's owner (the
same columns `billing.tenant_scope` copies per tenant); they never take a tenant-chosen
filter on that column.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import polars as pl

from market_pipeline.warehouse.store import Warehouse, WarehouseError

MAX_ROWS = 5000

COST_COMPONENTS = (
    "base_cost",
    "time_premium",
    "location_premium",
    "drainability_discount",
    "commitment_discount",
    "sla_credit",
)


def table_present(store: Warehouse, name: str) -> bool:
    frame = store.query(
        "SELECT count(*) AS n FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ?",
        [name],
    )
    return bool(frame["n"][0])


def _limit(limit: int) -> int:
    return max(1, min(int(limit), MAX_ROWS))


# -- prices (public: every tenant may see list and published prices) ---------------------


def prices_now(store: Warehouse) -> pl.DataFrame:
    """The price in force per pool and class: pool_id, resource_class, price, effective_from,
    source, reason (why it differs from the solver's, or null), solver_price, list_price."""
    return store.query(
        "SELECT pool_id, resource_class, CAST(arg_max(price_per_gpu_hour, effective_from) AS DOUBLE) AS price,"
        " max(effective_from) AS effective_from, arg_max(source, effective_from) AS source,"
        " arg_max(intervention_reason, effective_from) AS reason,"
        " CAST(arg_max(solver_price_per_gpu_hour, effective_from) AS DOUBLE) AS solver_price,"
        " CAST(arg_max(list_price_per_gpu_hour, effective_from) AS DOUBLE) AS list_price"
        " FROM price_book GROUP BY pool_id, resource_class ORDER BY pool_id, resource_class"
    )


def price_series(
    store: Warehouse,
    pool_id: str | None,
    resource_class: str | None,
    since: datetime | None,
    limit: int = MAX_ROWS,
) -> pl.DataFrame:
    """Published prices, oldest first (the newest `limit`): effective_from, pool_id,
    resource_class, price, source, reason."""
    return store.query(
        "SELECT * FROM (SELECT effective_from, pool_id, resource_class,"
        " CAST(price_per_gpu_hour AS DOUBLE) AS price, source, intervention_reason AS reason"
        " FROM price_book WHERE (? IS NULL OR pool_id = ?) AND (? IS NULL OR resource_class = ?)"
        " AND (? IS NULL OR effective_from >= ?) ORDER BY effective_from DESC LIMIT ?)"
        " ORDER BY effective_from, pool_id, resource_class",
        [pool_id, pool_id, resource_class, resource_class, since, since, _limit(limit)],
    )


def tick_reasons(store: Warehouse, pool_id: str | None, limit: int = MAX_ROWS) -> pl.DataFrame:
    """Each tick's published prices with why (market_ticks), oldest first: tick_at, pool_id,
    status, guaranteed, drainable, solver_guaranteed, solver_drainable, guaranteed_reason,
    drainable_reason, certified, margin, shadow."""
    return store.query(
        "SELECT * FROM (SELECT tick_at, pool_id, status, guaranteed, drainable, solver_guaranteed,"
        " solver_drainable, guaranteed_reason, drainable_reason, certified, margin, shadow"
        " FROM market_ticks WHERE (? IS NULL OR pool_id = ?) ORDER BY tick_at DESC LIMIT ?)"
        " ORDER BY tick_at, pool_id",
        [pool_id, pool_id, _limit(limit)],
    )


def latest_ticks(store: Warehouse) -> pl.DataFrame:
    """The latest tick per pool: every market_ticks column."""
    return store.query(
        "SELECT * FROM market_ticks WHERE tick_at = (SELECT max(tick_at) FROM market_ticks) ORDER BY pool_id"
    )


def tick_latencies(store: Warehouse, limit: int = 100) -> pl.DataFrame:
    """The latest `limit` published ticks' latency, newest first: tick_at, tick_seconds (wall
    seconds from the tick's run start to its prices published; ticks no run published are left
    out, as is a warehouse from before migration 442)."""
    if "tick_seconds" not in store.query("SELECT * FROM market_ticks LIMIT 0").columns:
        return pl.DataFrame(schema={"tick_at": pl.Datetime("us", "UTC"), "tick_seconds": pl.Float64})
    return store.query(
        "SELECT tick_at, max(tick_seconds) AS tick_seconds FROM market_ticks WHERE tick_seconds IS NOT NULL"
        " GROUP BY tick_at ORDER BY tick_at DESC LIMIT ?",
        [_limit(limit)],
    )


def pool_snapshots(store: Warehouse, since: datetime | None, limit: int = MAX_ROWS) -> pl.DataFrame:
    """Fleet demand per pool over time, oldest first: ts, pool_id, running_gpus, pending_gpus,
    gpus_on, utilisation (running / on)."""
    return store.query(
        "SELECT * FROM (SELECT ts, pool_id, running_gpus, pending_gpus, gpus_on,"
        " CASE WHEN gpus_on > 0 THEN running_gpus / gpus_on ELSE 0 END AS utilisation"
        " FROM pool_demand_snapshots WHERE (? IS NULL OR ts >= ?) ORDER BY ts DESC LIMIT ?)"
        " ORDER BY ts, pool_id",
        [since, since, _limit(limit)],
    )


def demand_heat(store: Warehouse, since: datetime | None) -> pl.DataFrame:
    """Demand per pool and hour (running + pending GPUs, hourly mean): pool_id, hour, demand."""
    return store.query(
        "SELECT pool_id, date_trunc('hour', ts) AS hour, avg(running_gpus + pending_gpus) AS demand"
        " FROM pool_demand_snapshots WHERE (? IS NULL OR ts >= ?) GROUP BY ALL ORDER BY hour, pool_id"
        f" LIMIT {MAX_ROWS}",
        [since, since],
    )


# -- one tenant's rows ---------------------------------------------------------------------
# These run through `billing.tenant_scope.tenant_query` (passed in as `run`): a private
# database holding only the tenant's rows of the tables they name, so they carry no tenant
# filter and cannot reach another tenant's rows, whatever their parameters.

TenantRunner = Callable[[str, list[object]], pl.DataFrame]


def tenant_invoice_lines(run: TenantRunner, grain: str, since: datetime | None, limit: int) -> pl.DataFrame:
    """Invoice lines at `grain` ('hour' or 'day'), newest first, from the dbt mart
    `fct_invoice_lines` (rated by billing, not here): invoice_id, period_start, period_end,
    pool_id, resource_class, charge_category, billed_seconds, consumed_gpu_hours, the cost
    components, billed_cost, currency."""
    columns = ", ".join(f"CAST({c} AS DOUBLE) AS {c}" for c in COST_COMPONENTS)
    return run(
        "SELECT invoice_id, period_start, period_end, pool_id, resource_class, charge_category,"
        f" billed_seconds, CAST(consumed_gpu_hours AS DOUBLE) AS consumed_gpu_hours, {columns},"
        " CAST(billed_cost AS DOUBLE) AS billed_cost, currency FROM fct_invoice_lines"
        " WHERE period_grain = ? AND (CAST(? AS TIMESTAMPTZ) IS NULL OR period_start >= ?)"
        " ORDER BY period_start DESC, pool_id, resource_class, charge_category LIMIT ?",
        [grain, since, since, _limit(limit)],
    )


def tenant_invoices(run: TenantRunner) -> pl.DataFrame:
    """Invoices (daily lines summed per invoice id), newest first: invoice_id, period_start,
    period_end, the cost components, billed_cost, currency."""
    columns = ", ".join(f"CAST(sum({c}) AS DOUBLE) AS {c}" for c in COST_COMPONENTS)
    return run(
        f"SELECT invoice_id, min(period_start) AS period_start, max(period_end) AS period_end, {columns},"
        " CAST(sum(billed_cost) AS DOUBLE) AS billed_cost, any_value(currency) AS currency"
        " FROM fct_invoice_lines WHERE period_grain = 'day'"
        f" GROUP BY invoice_id ORDER BY period_start DESC LIMIT {MAX_ROWS}",
        [],
    )


def tenant_daily_cost(run: TenantRunner) -> pl.DataFrame:
    """Daily cost by component (dbt mart `agg_tenant_daily_cost`), oldest first: day,
    gpu_hours, the cost components, billed_cost, currency."""
    columns = ", ".join(f"CAST({c} AS DOUBLE) AS {c}" for c in COST_COMPONENTS if c != "sla_credit")
    return run(
        f"SELECT day, CAST(gpu_hours AS DOUBLE) AS gpu_hours, {columns},"
        " CAST(sla_credits AS DOUBLE) AS sla_credit, CAST(billed_cost AS DOUBLE) AS billed_cost, currency"
        f" FROM agg_tenant_daily_cost ORDER BY day LIMIT {MAX_ROWS}",
        [],
    )


_DECISION_COLUMNS = (
    "decision_id, kind, pool_id, target, action, allowed, shadow, reasons, decided_at, executed_at,"
    " outcome, batch_id, inputs->>'tenant_id' AS tenant_id, inputs->>'node_id' AS node_id"
)


def tenant_drains(store: Warehouse, tenant_id: str, limit: int = MAX_ROWS) -> pl.DataFrame:
    """The tenant's drain decisions, newest first, with the drain's end (drain_billing_events):
    decision_id, pool_id, task_id, node_id, allowed, shadow, reasons, decided_at, executed_at,
    outcome, drain_reason, platform_fault."""
    return store.query(
        "SELECT d.decision_id, d.pool_id, d.target AS task_id, d.inputs->>'node_id' AS node_id, d.allowed,"
        " d.shadow, d.reasons, d.decided_at, d.executed_at, d.outcome, b.reason AS drain_reason,"
        " b.platform_fault FROM decisions d LEFT JOIN drain_billing_events b ON b.decision_id = d.decision_id"
        " WHERE d.kind = 'drain' AND (d.inputs->>'tenant_id') = ? ORDER BY d.decided_at DESC, d.decision_id"
        " LIMIT ?",
        [tenant_id, _limit(limit)],
    )


# -- operator -------------------------------------------------------------------------------


def decision_timeline(store: Warehouse, kinds: tuple[str, ...], limit: int = MAX_ROWS) -> pl.DataFrame:
    """Decisions of `kinds`, newest first: the decision columns with tenant_id and node_id."""
    return store.query(
        f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE list_contains(?, kind)"
        " ORDER BY decided_at DESC, decision_id LIMIT ?",
        [list(kinds), _limit(limit)],
    )


def search_decisions(
    store: Warehouse, node: str | None, tenant: str | None, pool: str | None, limit: int = 500
) -> pl.DataFrame:
    """Decisions touching a node (its target or input), a tenant or a pool, newest first."""
    return store.query(
        f"SELECT {_DECISION_COLUMNS} FROM decisions"
        " WHERE (? IS NULL OR target = ? OR (inputs->>'node_id') = ?)"
        " AND (? IS NULL OR (inputs->>'tenant_id') = ?) AND (? IS NULL OR pool_id = ?)"
        " ORDER BY decided_at DESC, decision_id LIMIT ?",
        [node, node, node, tenant, tenant, pool, pool, _limit(limit)],
    )


def decision_counts(store: Warehouse) -> pl.DataFrame:
    """Decisions by kind, outcome and reason (the text of the first reason before ':'):
    kind, allowed, outcome, reason, n."""
    return store.query(
        "SELECT kind, allowed, coalesce(outcome, 'pending') AS outcome,"
        " coalesce(split_part(reasons[1], ':', 1), 'none') AS reason, count(*) AS n"
        " FROM decisions WHERE NOT shadow GROUP BY ALL ORDER BY ALL"
    )


def drain_outcome_counts(store: Warehouse) -> pl.DataFrame:
    """Finished drains by outcome and reason (text before ':'): outcome, reason, n."""
    return store.query(
        "SELECT outcome, coalesce(split_part(reason, ':', 1), 'none') AS reason, count(*) AS n"
        " FROM drain_billing_events GROUP BY ALL ORDER BY ALL"
    )


def latest_solve(store: Warehouse) -> dict[str, object] | None:
    """The latest live solve: solved_at, status, converged, seconds, fallback_reason."""
    frame = store.query(
        "SELECT solved_at, status, converged, seconds, fallback_reason FROM solve_reports"
        " WHERE NOT shadow ORDER BY solved_at DESC LIMIT 1"
    )
    return frame.row(0, named=True) if frame.height else None


def telemetry_quarantine(store: Warehouse) -> pl.DataFrame:
    """Each source's latest ingest: source, partition_key, rows_in, quarantined, ingested_at."""
    return store.query(
        "SELECT source, arg_max(partition_key, ingested_at) AS partition_key,"
        " arg_max(rows_in, ingested_at) AS rows_in, arg_max(quarantined, ingested_at) AS quarantined,"
        " max(ingested_at) AS ingested_at FROM telemetry_ingests GROUP BY source ORDER BY source"
    )


def gpu_utilisation(store: Warehouse) -> pl.DataFrame:
    """Per GPU over the latest telemetry partition: pool_id, node_id, gpu_uuid, sm_util_pct
    (mean), mem_used_pct (peak), last_ts."""
    try:
        return store.query(
            "WITH latest AS (SELECT max(partition_key) AS p FROM telemetry_clean)"
            " SELECT coalesce(n.pool_id, 'unknown') AS pool_id, c.node_id, c.gpu_uuid,"
            " avg(c.sm_util_pct) AS sm_util_pct,"
            " max(CASE WHEN c.mem_total_mib > 0 THEN 100 * c.mem_used_mib / c.mem_total_mib END) AS mem_used_pct,"
            " max(c.ts) AS last_ts"
            " FROM telemetry_clean c LEFT JOIN fleet_nodes n USING (node_id)"
            " WHERE c.partition_key = (SELECT p FROM latest) GROUP BY ALL ORDER BY ALL"
            f" LIMIT {MAX_ROWS}"
        )
    except WarehouseError:
        return pl.DataFrame()
