"""What the pricing step reads from and writes to the warehouse between ticks."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta

import polars as pl

from market_pipeline.market import SolveReport
from market_pipeline.warehouse import Warehouse

FORECAST_HORIZON_MIN = 60


def tick_origin(now: datetime, step_minutes: int) -> datetime:
    """`now` floored to the tick grid, so every step of one tick agrees on the time."""
    floored = now.replace(second=0, microsecond=0)
    return floored - timedelta(minutes=floored.minute % step_minutes)


def capacity_by_pool(store: Warehouse) -> dict[str, float]:
    """GPUs powered on per pool, from the latest fleet inventory."""
    frame = store.query("SELECT pool_id, sum(gpus) AS gpus FROM fleet_nodes WHERE state = 'on' GROUP BY pool_id")
    return {row["pool_id"]: float(row["gpus"]) for row in frame.iter_rows(named=True)}


def expected_demand_by_pool(store: Warehouse, origin: datetime) -> dict[str, float]:
    """GPUs each pool is expected to need over the next hour: the latest forecast's median an
    hour ahead, else (no forecast yet) the latest observed demand."""
    frame = store.query(
        """
        WITH f AS (SELECT pool_id, q50 FROM demand_forecasts
                   WHERE origin_ts = (SELECT max(origin_ts) FROM demand_forecasts WHERE origin_ts <= ?)
                     AND horizon_min = ?),
             d AS (SELECT pool_id, arg_max(demand, ts) AS demand_now FROM demand_history
                   WHERE ts < ? GROUP BY pool_id)
        SELECT pool_id, coalesce(f.q50, d.demand_now) AS expected
        FROM f FULL OUTER JOIN d USING (pool_id)
        """, [origin, FORECAST_HORIZON_MIN, origin])
    return {row["pool_id"]: max(float(row["expected"]), 0.0) for row in frame.iter_rows(named=True)
            if row["expected"] is not None}


def typical_demand_by_pool(store: Warehouse, origin: datetime) -> dict[str, float]:
    """Each pool's usual load: its mean demand over the demand history before `origin` (the
    days `demand_history` keeps), from the fleet's first snapshot on (the grid before it is
    no observation, not zero demand). Pools with no history yet are left out."""
    frame = store.query(
        "SELECT pool_id, avg(demand) AS typical FROM demand_history WHERE ts < ? "
        "AND ts >= (SELECT min(ts) FROM pool_demand_snapshots) GROUP BY pool_id", [origin])
    return {r["pool_id"]: float(r["typical"]) for r in frame.iter_rows(named=True)
            if r["typical"] is not None and r["typical"] > 0}


def last_certified_prices(store: Warehouse) -> dict[str, float]:
    """The prices in force per resource (`<pool>/<class>`), from the price book."""
    frame = store.query(
        "SELECT pool_id || '/' || resource_class AS resource, "
        "CAST(arg_max(price_per_gpu_hour, effective_from) AS DOUBLE) AS price "
        "FROM price_book GROUP BY 1")
    return {row["resource"]: row["price"] for row in frame.iter_rows(named=True)}


def solve_record(report: SolveReport, solved_at: datetime, shadow: bool) -> pl.DataFrame:
    body = report.to_dict()
    return pl.DataFrame([{
        "solve_id": f"solve-{solved_at:%Y%m%dT%H%M}-{uuid.uuid4().hex[:8]}",
        "solved_at": solved_at,
        "status": str(body.get("status", "converged" if report.converged else "fallback")),
        "converged": bool(report.converged),
        "profit": body.get("profit"),
        "kkt_residual": body.get("kkt_residual"),
        "iterations": int(body.get("iterations") or 0),
        "seconds": float(body.get("seconds") or 0.0),
        "fallback_reason": body.get("fallback_reason"),
        "shadow": shadow,
        "report": json.dumps(body),
    }], schema_overrides={"solved_at": pl.Datetime("us", "UTC"), "profit": pl.Float64,
                          "kkt_residual": pl.Float64, "fallback_reason": pl.Utf8})


def shadow_price_decisions(rows: pl.DataFrame, decided_at: datetime) -> pl.DataFrame:
    """Shadow mode: the price changes the loop would publish, as decisions it did not execute."""
    return pl.DataFrame([{
        "decision_id": f"price-{r['solve_id']}-{r['pool_id']}-{r['resource_class']}",
        "kind": "price", "pool_id": r["pool_id"], "target": r["resource_class"],
        "action": "publish_price", "allowed": True, "shadow": True,
        "reasons": ["shadow mode: recorded, not published"],
        "inputs": json.dumps({"price_per_gpu_hour": str(r["price_per_gpu_hour"]),
                              "effective_from": r["effective_from"].isoformat()}),
        "decided_at": decided_at,
    } for r in rows.iter_rows(named=True)], schema_overrides={"decided_at": pl.Datetime("us", "UTC"),
                                                              "reasons": pl.List(pl.Utf8)})
