"""What a run of the control loop did, read back from the warehouse (the demo's printout)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.warehouse import Warehouse, loop_readers


def summarise(
    store: Warehouse, config: MarketPipelineConfig, start: datetime, end: datetime
) -> dict[str, Any]:
    fleet = loop_readers.fleet_counts(store)
    telemetry = loop_readers.telemetry_counts(store, start, end)
    usage = loop_readers.usage_in_window(store, start, end)
    solves = loop_readers.solve_counts(store, start, end)
    return {
        "simulated_from": start.isoformat(),
        "simulated_until": end.isoformat(),
        "nodes": fleet.nodes,
        "nodes_on": fleet.nodes_on,
        "gpus": fleet.gpus,
        "samples_ingested": telemetry.ingested,
        "samples_clean": telemetry.clean_in_window,
        "samples_quarantined": telemetry.quarantined,
        "tasks_seen": usage.tasks_seen,
        "mean_gpu_utilisation_pct": round(telemetry.mean_sm_util_pct, 2),
        "gpu_hours_metered": round(usage.gpu_hours, 2),
        "solves": solves.solves,
        "solves_converged": solves.converged,
        "latest_prices": [asdict(row) for row in loop_readers.latest_prices(store)],
        "decisions": [asdict(row) for row in loop_readers.decision_counts(store, start, end)],
        "drains": [asdict(row) for row in loop_readers.drain_outcome_counts(store)],
        "billing_reconciliation": asdict(loop_readers.reconciliation(store)),
        "billed_cost": str(loop_readers.billed_cost_daily(store)),
        "shadow_mode": config.loop.shadow_mode,
        "warehouse": store.location,
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
