"""What a run of the control loop did, read back from the warehouse (the demo's printout)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.warehouse import Warehouse


def summarise(
    store: Warehouse, config: MarketPipelineConfig, start: datetime, end: datetime
) -> dict[str, Any]:
    def one(sql: str, params: list | None = None) -> Any:
        return store.query(sql, params or []).row(0)[0]

    window = [start, end]
    return {
        "simulated_from": start.isoformat(),
        "simulated_until": end.isoformat(),
        "nodes": one("SELECT count(*) FROM fleet_nodes"),
        "nodes_on": one("SELECT count(*) FROM fleet_nodes WHERE state = 'on'"),
        "gpus": one("SELECT count(*) FROM fleet_gpus"),
        "samples_ingested": one("SELECT coalesce(sum(rows_in), 0) FROM telemetry_ingests"),
        "samples_clean": one("SELECT count(*) FROM telemetry_clean WHERE ts >= ? AND ts < ?", window),
        "samples_quarantined": one("SELECT coalesce(sum(quarantined), 0) FROM telemetry_ingests"),
        "tasks_seen": one(
            "SELECT count(DISTINCT task_id) FROM usage_intervals WHERE started_at < ? AND ended_at > ?",
            [end, start],
        ),
        "mean_gpu_utilisation_pct": round(
            float(
                one(
                    "SELECT coalesce(avg(sm_util_pct), 0) FROM telemetry_clean WHERE ts >= ? AND ts < ?",
                    window,
                )
            ),
            2,
        ),
        "gpu_hours_metered": round(
            float(
                one(
                    "SELECT coalesce(sum(epoch(ended_at - started_at) * gpu_fraction), 0) / 3600 FROM usage_intervals "
                    "WHERE started_at >= ? AND started_at < ?",
                    window,
                )
            ),
            2,
        ),
        "solves": one("SELECT count(*) FROM solve_reports WHERE solved_at > ? AND solved_at <= ?", window),
        "solves_converged": one(
            "SELECT count(*) FROM solve_reports WHERE converged AND solved_at > ? AND solved_at <= ?", window
        ),
        "latest_prices": store.query(
            "SELECT pool_id, resource_class, CAST(arg_max(price_per_gpu_hour, effective_from) AS DOUBLE) AS price "
            "FROM price_book GROUP BY ALL ORDER BY ALL"
        ).to_dicts(),
        "decisions": store.query(
            "SELECT kind, action, allowed, count(*) AS n FROM decisions WHERE decided_at > ? AND decided_at <= ? "
            "GROUP BY ALL ORDER BY ALL",
            window,
        ).to_dicts(),
        "drains": store.query(
            "SELECT outcome, count(*) AS n FROM drain_billing_events GROUP BY ALL ORDER BY ALL"
        ).to_dicts(),
        "billing_reconciliation": reconciliation(store),
        "billed_cost": str(
            one("SELECT coalesce(sum(billed_cost), 0) FROM fct_invoice_lines WHERE period_grain = 'day'")
        ),
        "shadow_mode": config.loop.shadow_mode,
        "warehouse": store.location,
    }


def reconciliation(store: Warehouse) -> dict[str, int]:
    """Every metered usage interval is rated, and its seconds with it (fct_rated_usage)."""
    usage = store.query(
        "SELECT count(*), coalesce(sum(epoch(ended_at - started_at)), 0)::BIGINT FROM usage_intervals"
    ).row(0)
    rated = store.query(
        "SELECT count(DISTINCT interval_id), coalesce(sum(metered_seconds), 0)::BIGINT FROM fct_rated_usage"
    ).row(0)
    unrated = store.query(
        "SELECT count(*) FROM usage_intervals u WHERE NOT EXISTS "
        "(SELECT 1 FROM fct_rated_usage r WHERE r.interval_id = u.interval_id)"
    ).row(0)[0]
    return {
        "usage_intervals": int(usage[0]),
        "rated_intervals": int(rated[0]),
        "unrated_intervals": int(unrated),
        "metered_seconds": int(usage[1]),
        "rated_seconds": int(rated[1]),
    }


def wall_summary(total_s: float, tick_seconds: list[float], hour_seconds: list[float]) -> dict[str, float]:
    """Wall time of a run of the loop: control ticks (control_loop_job runs) and simulated hours."""
    ordered = sorted(tick_seconds)
    median = ordered[len(ordered) // 2] if ordered else 0.0
    per_hour = sum(hour_seconds) / len(hour_seconds) if hour_seconds else 0.0
    return {
        "total_s": round(total_s, 2),
        "simulated_hours": len(hour_seconds),
        "control_tick_median_s": round(median, 2),
        "control_tick_max_s": round(max(ordered, default=0.0), 2),
        "simulated_hour_mean_s": round(per_hour, 2),
        "simulated_day_projected_s": round(24 * per_hour, 1),
    }


def render(summary: dict[str, Any]) -> str:
    prices = "\n".join(
        f"    {p['pool_id']:<28} {p['resource_class']:<11} {p['price']:8.3f} /GPU-h"
        for p in summary["latest_prices"]
    )
    decisions = (
        "\n".join(
            f"    {d['kind']:<8} {d['action']:<16} {'allowed' if d['allowed'] else 'blocked':<8} {d['n']}"
            for d in summary["decisions"]
        )
        or "    (none)"
    )
    drains = ", ".join(f"{d['outcome']}={d['n']}" for d in summary["drains"]) or "none"
    rec = summary["billing_reconciliation"]
    wall = summary.get("wall", {})
    return f"""
Control loop: {summary["simulated_from"]} .. {summary["simulated_until"]} (simulated fleet)
  nodes            {summary["nodes"]} ({summary["nodes_on"]} on), GPUs {summary["gpus"]}
  samples          {summary["samples_ingested"]} ingested, {summary["samples_clean"]} clean in window, {summary["samples_quarantined"]} quarantined
  tasks            {summary["tasks_seen"]} metered, {summary["gpu_hours_metered"]} GPU-hours
  mean GPU util    {summary["mean_gpu_utilisation_pct"]} %
  solves           {summary["solves"]} ({summary["solves_converged"]} converged){" [shadow mode]" if summary["shadow_mode"] else ""}
  prices now
{prices}
  decisions
{decisions}
  drains           {drains}
  billed           {summary["billed_cost"]} (fct_invoice_lines, daily grain)
  reconciled       {rec["rated_intervals"]}/{rec["usage_intervals"]} intervals rated ({rec["unrated_intervals"]} unrated), {rec["rated_seconds"]}/{rec["metered_seconds"]} s
  runs             {summary.get("failed_runs", 0)} failed; wall {wall.get("total_s", 0)} s, control tick median {wall.get("control_tick_median_s", 0)} s
  warehouse        {summary["warehouse"]}
    query it:      .venv/bin/market-pipeline sql "select * from fct_invoice_lines limit 10"
  Dagster UI:      make ui   (dagster dev -w workspace.yaml -h 127.0.0.1, then http://127.0.0.1:3000)
"""
