"""Typed readers of what the loop's steps read back from the warehouse.

The assets and sensors hold no SQL: each read they need is one function here, named for what
it returns (a frame with the columns its docstring lists, a mapping, a scalar). Readers open
the warehouse read-only.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from market_pipeline.warehouse.store import Warehouse, WarehouseError

# -- demand ------------------------------------------------------------------------------


def usage_overlapping(store: Warehouse, start: datetime, end: datetime) -> pl.DataFrame:
    """Usage intervals overlapping [start, end): pool_id, started_at, ended_at, gpu_fraction."""
    return store.query(
        "SELECT pool_id, started_at, ended_at, gpu_fraction FROM usage_intervals "
        "WHERE ended_at > ? AND started_at < ?",
        [start, end],
    )


def pending_snapshots_before(store: Warehouse, end: datetime) -> pl.DataFrame:
    """GPUs waiting per pool at each fleet snapshot before `end`: ts, pool_id, pending_gpus."""
    return store.query("SELECT ts, pool_id, pending_gpus FROM pool_demand_snapshots WHERE ts < ?", [end])


def demand_history_before(store: Warehouse, origin: datetime) -> pl.DataFrame:
    """The demand grid before `origin`, by pool and time: pool_id, ts, demand, price."""
    return store.query(
        "SELECT pool_id, ts, demand, price FROM demand_history WHERE ts < ? ORDER BY pool_id, ts", [origin]
    )


def expected_demand_by_pool(store: Warehouse, origin: datetime, horizon_min: int) -> dict[str, float]:
    """GPUs each pool is expected to need `horizon_min` ahead: the latest forecast's median
    there, else (no forecast yet) the latest observed demand."""
    frame = store.query(
        """
        WITH f AS (SELECT pool_id, q50 FROM demand_forecasts
                   WHERE origin_ts = (SELECT max(origin_ts) FROM demand_forecasts WHERE origin_ts <= ?)
                     AND horizon_min = ?),
             d AS (SELECT pool_id, arg_max(demand, ts) AS demand_now FROM demand_history
                   WHERE ts < ? GROUP BY pool_id)
        SELECT pool_id, coalesce(f.q50, d.demand_now) AS expected
        FROM f FULL OUTER JOIN d USING (pool_id)
        """,
        [origin, horizon_min, origin],
    )
    return {
        row["pool_id"]: max(float(row["expected"]), 0.0)
        for row in frame.iter_rows(named=True)
        if row["expected"] is not None
    }


def typical_demand_by_pool(store: Warehouse, origin: datetime) -> dict[str, float]:
    """Each pool's usual load: its mean demand over the demand history before `origin` (the
    days `demand_history` keeps), from the fleet's first snapshot on (the grid before it is
    no observation, not zero demand). Pools with no history yet are left out."""
    frame = store.query(
        "SELECT pool_id, avg(demand) AS typical FROM demand_history WHERE ts < ? "
        "AND ts >= (SELECT min(ts) FROM pool_demand_snapshots) GROUP BY pool_id",
        [origin],
    )
    return {
        r["pool_id"]: float(r["typical"])
        for r in frame.iter_rows(named=True)
        if r["typical"] is not None and r["typical"] > 0
    }


def latest_demand_by_pool(store: Warehouse, before: datetime) -> dict[str, tuple[float, float]]:
    """Per pool, the latest (demand, pending GPUs) of the demand history before `before`."""
    frame = store.query(
        "SELECT pool_id, arg_max(demand, ts) AS demand, arg_max(pending_gpus, ts) AS pending "
        "FROM demand_history WHERE ts < ? GROUP BY pool_id",
        [before],
    )
    return {r["pool_id"]: (float(r["demand"]), float(r["pending"])) for r in frame.iter_rows(named=True)}


def guarantee_backing_by_pool(store: Warehouse, before: datetime) -> dict[str, tuple[float, float]]:
    """Per pool, from its latest demand snapshot before `before` that observed them, the GPUs
    drainable tasks held and those waiting guaranteed jobs asked for (what the rigid
    guarantee can back, `tick.promises.guarantee_reach`). Pools never observed so are absent."""
    frame = store.query(
        "SELECT pool_id, arg_max(drainable_running_gpus, ts) AS drainable, "
        "arg_max(guaranteed_pending_gpus, ts) AS waiting FROM pool_demand_snapshots "
        "WHERE ts < ? AND drainable_running_gpus IS NOT NULL AND guaranteed_pending_gpus IS NOT NULL "
        "GROUP BY pool_id",
        [before],
    )
    return {r["pool_id"]: (float(r["drainable"]), float(r["waiting"])) for r in frame.iter_rows(named=True)}


def guaranteed_claim_by_pool(store: Warehouse, before: datetime) -> dict[str, float]:
    """Per pool, from its latest demand snapshot before `before` that observed the classes, the
    GPUs guaranteed work holds and waits for (running less drainable, plus the guaranteed
    queue): the guaranteed class's claim on the pool now (`tick.pricing.drainable_capacity`).
    Pools never observed so are absent."""
    frame = store.query(
        "SELECT pool_id, arg_max(greatest(running_gpus - drainable_running_gpus, 0) "
        "+ guaranteed_pending_gpus, ts) AS claim FROM pool_demand_snapshots "
        "WHERE ts < ? AND drainable_running_gpus IS NOT NULL AND guaranteed_pending_gpus IS NOT NULL "
        "GROUP BY pool_id",
        [before],
    )
    return {r["pool_id"]: float(r["claim"]) for r in frame.iter_rows(named=True)}


def forecast_upper_by_pool(store: Warehouse, origin: datetime, horizon_min: int) -> dict[str, float | None]:
    """Per pool, the latest forecast's (made at or before `origin`) highest q90 up to
    `horizon_min` ahead."""
    frame = store.query(
        "SELECT pool_id, max(q90) AS q90 FROM demand_forecasts WHERE origin_ts = "
        "(SELECT max(origin_ts) FROM demand_forecasts WHERE origin_ts <= ?) AND horizon_min <= ? "
        "GROUP BY pool_id",
        [origin, horizon_min],
    )
    return dict(frame.iter_rows())


def fleet_gpus_by_pool(store: Warehouse) -> dict[str, float]:
    """Every GPU per pool in the latest fleet inventory, powered on or not."""
    return dict(
        store.query("SELECT pool_id, sum(gpus)::DOUBLE FROM fleet_nodes GROUP BY pool_id").iter_rows()
    )


def capacity_by_pool(store: Warehouse) -> dict[str, float]:
    """GPUs powered on per pool, from the latest fleet inventory."""
    frame = store.query(
        "SELECT pool_id, sum(gpus) AS gpus FROM fleet_nodes WHERE state = 'on' GROUP BY pool_id"
    )
    return {row["pool_id"]: float(row["gpus"]) for row in frame.iter_rows(named=True)}


# -- prices ------------------------------------------------------------------------------


def guaranteed_prices_before(store: Warehouse, end: datetime) -> pl.DataFrame:
    """The guaranteed price book before `end`: effective_from, pool_id, price (float)."""
    return store.query(
        "SELECT effective_from, pool_id, CAST(price_per_gpu_hour AS DOUBLE) AS price "
        "FROM price_book WHERE resource_class = 'guaranteed' AND effective_from < ?",
        [end],
    )


def price_book_is_empty(store: Warehouse) -> bool:
    return store.query("SELECT count(*) AS n FROM price_book")["n"][0] == 0


def price_history(store: Warehouse, since: datetime) -> pl.DataFrame:
    """Published prices from `since` on, oldest first: effective_from, resource
    (`<pool>/<class>`), price (float)."""
    return store.query(
        "SELECT effective_from, pool_id || '/' || resource_class AS resource, "
        "CAST(price_per_gpu_hour AS DOUBLE) AS price FROM price_book "
        "WHERE effective_from >= ? ORDER BY effective_from",
        [since],
    )


def last_certified_prices(store: Warehouse) -> dict[str, float]:
    """The prices in force per resource (`<pool>/<class>`), from the price book."""
    frame = store.query(
        "SELECT pool_id || '/' || resource_class AS resource, "
        "CAST(arg_max(price_per_gpu_hour, effective_from) AS DOUBLE) AS price "
        "FROM price_book GROUP BY 1"
    )
    return {row["resource"]: row["price"] for row in frame.iter_rows(named=True)}


def latest_tick(store: Warehouse, at: datetime) -> pl.DataFrame:
    """The latest market tick at or before `at`, one row per pool (the `market_ticks` columns:
    the published, solver and list prices with the reasons, the certificate, the capacity
    target, the forecast the tick sized to); empty before the first tick."""
    return store.query(
        "SELECT * FROM market_ticks WHERE tick_at = (SELECT max(tick_at) FROM market_ticks WHERE tick_at <= ?) "
        "ORDER BY pool_id",
        [at],
    )


def latest_tick_at(store: Warehouse) -> datetime | None:
    """When the latest market tick was stored; None before the first."""
    return store.query("SELECT max(tick_at) AS t FROM market_ticks")["t"][0]


# -- demand response ---------------------------------------------------------------------


def fit_at(store: Warehouse, at: datetime) -> pl.DataFrame:
    """The latest demand-response fit at or before `at`, one row per pool and class (the
    `demand_response` columns), ordered by pool and class; empty before the first fit."""
    return store.query(
        "SELECT * FROM demand_response WHERE fitted_at = "
        "(SELECT max(fitted_at) FROM demand_response WHERE fitted_at <= ?) "
        "ORDER BY pool_id, resource_class",
        [at],
    )


def fit_experiments_before(store: Warehouse, before: datetime) -> pl.DataFrame:
    """The experiments of the latest fit strictly before `before`: pool_id, resource_class,
    experiment, experiment_id."""
    return store.query(
        "SELECT pool_id, resource_class, experiment, experiment_id FROM demand_response WHERE fitted_at = "
        "(SELECT max(fitted_at) FROM demand_response WHERE fitted_at < ?)",
        [before],
    )


def experiments_of_fit(store: Warehouse, fitted_at: datetime, status: str, tick_minutes: int) -> pl.DataFrame:
    """The price experiments the fit at `fitted_at` left in `status`: experiment_id, pool_id,
    resource_class, ticks, since, estimated_cost (over their ticks of `tick_minutes`), published."""
    return store.query(
        "SELECT experiment_id, pool_id, resource_class, count(*) AS ticks, min(tick_at) AS since, "
        "sum(estimated_cost_per_hour) * ? / 60.0 AS estimated_cost, bool_and(published) AS published "
        "FROM price_experiments WHERE experiment_id IN (SELECT experiment_id FROM demand_response "
        "WHERE fitted_at = ? AND experiment = ?) GROUP BY ALL ORDER BY experiment_id",
        [tick_minutes, fitted_at, status],
    )


def class_demand_by_hour(store: Warehouse, start: datetime, end: datetime) -> pl.DataFrame:
    """Per hour of [start, end), pool and resource class with usage: ts, pool_id,
    resource_class, price (the price book's in force at the hour's start, null when none was),
    demand (GPU-hours used in the hour), by pool, class and hour."""
    return store.query(
        """WITH hours AS (SELECT unnest(generate_series(date_trunc('hour', ?::TIMESTAMPTZ),
                                                       ?::TIMESTAMPTZ - INTERVAL 1 HOUR, INTERVAL 1 HOUR)) AS ts),
           used AS (
             SELECT h.ts, u.pool_id, u.resource_class,
                    sum(CAST(u.gpu_fraction AS DOUBLE) * epoch(least(u.ended_at, h.ts + INTERVAL 1 HOUR)
                        - greatest(u.started_at, h.ts)) / 3600.0) AS demand
             FROM hours h JOIN usage_intervals u
               ON u.started_at < h.ts + INTERVAL 1 HOUR AND u.ended_at > h.ts
             GROUP BY 1, 2, 3)
           SELECT u.ts, u.pool_id, u.resource_class,
                  (SELECT CAST(b.price_per_gpu_hour AS DOUBLE) FROM price_book b
                   WHERE b.pool_id = u.pool_id AND b.resource_class = u.resource_class
                     AND b.effective_from <= u.ts ORDER BY b.effective_from DESC LIMIT 1) AS price,
                  u.demand
           FROM used u ORDER BY u.pool_id, u.resource_class, u.ts""",
        [start, end],
    )


def elasticity_history(store: Warehouse, since: datetime) -> pl.DataFrame:
    """Fitted elasticities from `since` on, oldest first: fitted_at, resource, elasticity."""
    return store.query(
        "SELECT fitted_at, pool_id || '/' || resource_class AS resource, elasticity FROM demand_response "
        "WHERE fitted_at >= ? AND elasticity IS NOT NULL ORDER BY fitted_at",
        [since],
    )


# -- billing and soak accounting ---------------------------------------------------------


def tenant_balances(store: Warehouse) -> pl.DataFrame:
    """Each tenant's ledger balance: tenant_id, balance."""
    return store.query("SELECT tenant_id, sum(amount) AS balance FROM billing_ledger GROUP BY 1 ORDER BY 1")


def telemetry_rows_unaccounted(store: Warehouse) -> int:
    """Telemetry rows an ingest took in that are neither clean nor quarantined, over all partitions."""
    return int(
        store.query("""
        WITH ins AS (SELECT partition_key, sum(rows_in) AS rows_in FROM telemetry_ingests GROUP BY 1),
             clean AS (SELECT partition_key, count(*) AS n FROM telemetry_clean GROUP BY 1),
             quarantine AS (SELECT partition_key, count(*) AS n FROM telemetry_quarantine GROUP BY 1)
        SELECT coalesce(sum(abs(ins.rows_in - coalesce(clean.n, 0) - coalesce(quarantine.n, 0))), 0)
        FROM ins LEFT JOIN clean USING (partition_key) LEFT JOIN quarantine USING (partition_key)""").row(0)[
            0
        ]
    )


def metered_seconds_unbilled(store: Warehouse) -> int:
    """Metered seconds of billed hours that the rated usage does not hold (0 before dbt built it)."""
    try:
        return int(
            store.query("""
        SELECT coalesce(sum(u.metered_seconds), 0) FROM usage_intervals u
        WHERE u.partition_key IN (SELECT DISTINCT partition_key FROM fct_rated_usage)
          AND NOT EXISTS (SELECT 1 FROM fct_rated_usage r WHERE r.interval_id = u.interval_id)""").row(0)[0]
        )
    except WarehouseError:  # no hour billed yet (dbt has not built the mart)
        return 0


def metered_seconds_held(store: Warehouse, partition_key: str) -> int:
    """Metered interval-seconds the warehouse holds for one hour (per GPU row, as metering
    reports them)."""
    return int(
        store.query(
            "SELECT coalesce(sum(date_diff('second', started_at, ended_at)), 0) FROM usage_intervals "
            "WHERE partition_key = ?",
            [partition_key],
        ).row(0)[0]
    )


def decisions_stored_twice(store: Warehouse) -> int:
    """Decision rows beyond the first of their id (a lake keeps no primary key)."""
    return int(store.query("SELECT count(*) - count(DISTINCT decision_id) FROM decisions").row(0)[0])


# -- scaling -----------------------------------------------------------------------------


def failed_drains_by_node(store: Warehouse) -> dict[str, int]:
    """Per node, the drains billed as failed or aborted."""
    frame = store.query(
        "SELECT node_id, count(*) AS n FROM drain_billing_events "
        "WHERE outcome IN ('failed', 'aborted') GROUP BY node_id"
    )
    return {row["node_id"]: int(row["n"]) for row in frame.iter_rows(named=True)}


def scaler_memory_of(store: Warehouse, pool_id: str) -> dict | None:
    """The pool's scaler memory as stored (the JSON document), None before its first tick."""
    frame = store.query("SELECT memory FROM scaler_memory WHERE pool_id = ?", [pool_id])
    return None if frame.is_empty() else json.loads(frame["memory"][0])


def latest_decision_at(store: Warehouse, kind: str) -> datetime | None:
    """When the latest decision of `kind` was made, None if none was."""
    return store.query("SELECT max(decided_at) AS t FROM decisions WHERE kind = ?", [kind])["t"][0]


# -- what the decision checks read -------------------------------------------------------


def pool_nodes_on(store: Warehouse) -> dict[str, int]:
    """Nodes powered on per pool (what the budgets' percentages are of)."""
    frame = store.query("SELECT pool_id, count(*) AS n FROM fleet_nodes WHERE state = 'on' GROUP BY 1")
    return {r["pool_id"]: int(r["n"]) for r in frame.iter_rows(named=True)}


def latest_plan(store: Warehouse) -> pl.DataFrame:
    """The latest scaling plan's decisions (pool_id, target, action, allowed, inputs)."""
    return store.query(
        "SELECT pool_id, target, action, allowed, shadow, inputs FROM decisions WHERE kind = 'scale' "
        "AND decided_at = (SELECT max(decided_at) FROM decisions WHERE kind = 'scale') ORDER BY pool_id"
    )


def latest_uncordons(store: Warehouse) -> pl.DataFrame:
    """The latest scaling plan's live uncordon decisions (pool_id, target, reasons, inputs)."""
    return store.query(
        "SELECT pool_id, target, reasons, inputs FROM decisions WHERE kind = 'scale' AND action = 'uncordon'"
        " AND NOT shadow AND decided_at = (SELECT max(decided_at) FROM decisions WHERE kind = 'scale')"
        " ORDER BY pool_id, target"
    )


def published_with_previous(store: Warehouse, at: datetime | None = None) -> pl.DataFrame:
    """The price-book rows of the latest publication (or at `at`), each with the price in
    force before it (`previous`, null when none was published before)."""
    return store.query(
        "WITH latest AS (SELECT coalesce(?::TIMESTAMPTZ, max(effective_from)) AS t FROM price_book) "
        "SELECT p.pool_id, p.resource_class, p.effective_from, CAST(p.price_per_gpu_hour AS DOUBLE) AS price, "
        "CAST(p.list_price_per_gpu_hour AS DOUBLE) AS list_price, p.source, "
        "(SELECT CAST(arg_max(q.price_per_gpu_hour, q.effective_from) AS DOUBLE) FROM price_book q "
        " WHERE q.pool_id = p.pool_id AND q.resource_class = p.resource_class "
        " AND q.effective_from < p.effective_from) AS previous "
        "FROM price_book p, latest WHERE p.effective_from = latest.t ORDER BY p.pool_id, p.resource_class",
        [at],
    )


def approved_live_drains(store: Warehouse, after: datetime, until: datetime) -> pl.DataFrame:
    """Approved live drain decisions made in (after, until]: decision_id, pool_id, tenant_id,
    node_id, trigger (the last three from the task's snapshot), decided_at, outcome."""
    return store.query(
        "SELECT decision_id, pool_id, inputs->>'tenant_id' AS tenant_id, inputs->>'node_id' AS node_id, "
        "inputs->>'trigger' AS trigger, decided_at, outcome FROM decisions WHERE kind = 'drain' "
        "AND allowed AND NOT shadow AND decided_at > ? AND decided_at <= ?",
        [after, until],
    )


def approved_node_actions(store: Warehouse, after: datetime, until: datetime) -> pl.DataFrame:
    """Approved live cordon, replace and uncordon decisions made in (after, until], oldest
    first: target, action, decided_at, outcome."""
    return store.query(
        "SELECT target, action, decided_at, outcome FROM decisions WHERE kind = 'scale' AND allowed "
        "AND NOT shadow AND target IS NOT NULL AND action IN ('cordon', 'replace', 'uncordon') "
        "AND decided_at > ? AND decided_at <= ? ORDER BY decided_at",
        [after, until],
    )


def latest_tick_solve(store: Warehouse) -> dict[str, object] | None:
    """The solve report of the latest market tick (None before the first tick)."""
    frame = store.query(
        "SELECT s.solve_id, s.solved_at, s.status, s.converged, s.kkt_residual, s.iterations, "
        "s.fallback_reason, s.shadow FROM solve_reports s WHERE s.solve_id = ("
        "SELECT any_value(solve_id) FROM market_ticks WHERE tick_at = (SELECT max(tick_at) FROM market_ticks))"
    )
    return frame.row(0, named=True) if frame.height else None


def table_exists(warehouse: Warehouse, name: str) -> bool:
    """Whether the warehouse has a table of this name (False before it exists)."""
    if not warehouse.exists():
        return False
    with warehouse.connect(read_only=True) as con:
        row = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
        ).fetchone()
    return bool(row and row[0])
