"""`market-pipeline bench scale`: does the cluster profile's control state let workers scale out?

What it measures (and what it does not). Each worker is a separate process, as a Celery worker
is. For 1 worker (the baseline) and for each other count, in the same run, the workers race
through the same batches of decisions the way `action_batches.carry_out` does: claim the batch
in the control PostgreSQL (`decision_claims`), carry out each decision taken (an action of
`act_ms`, the adapter call), write its drain step (`drain_journal`, primary key) and record its
outcome (first one kept). It reports decisions per hour for each count, the speedup over one
worker, and what the constraints must guarantee: decisions lost (no outcome), decisions carried
out twice, steps refused, workers failed.

It does NOT run the whole control tick (telemetry, metering backfill, the market solve, dbt) on
the spot fleet through Dagster and Celery: that needs more cores than a shared 2-core machine
has to say anything about 2 workers against 1. Each count gets a schema of its own in the
control PostgreSQL, dropped afterwards.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from market_pipeline.warehouse.control import ControlConflict, ControlStore

TARGET_SPEEDUP = 1.5  # issue #43: 2 workers give at least 1.5x the rate of 1


@dataclass(frozen=True)
class ScaleBenchSettings:
    control_url: str
    workers: tuple[int, ...] = (1, 2)
    batches: int = 40
    per_batch: int = 25
    act_ms: float = 20.0
    schema_prefix: str = "bench_scale"
    rounds: int = 1  # each count this many times, counts alternating (1, 2, 1, 2, ...)


def _worker(url: str, schema: str, settings: ScaleBenchSettings, run_id: str, ready: Any, out: Any) -> None:
    control = ControlStore(url, schema)
    acted: list[str] = []
    refused = 0
    now = datetime.now(UTC)
    control.claims(["warm-up"])  # connected before the clock starts
    ready.wait()
    began = time.time()
    for b in range(settings.batches):
        ids = [f"b{b:04d}-d{d:03d}" for d in range(settings.per_batch)]
        taken = control.claim(ids, f"scale@{b}", run_id, now, [run_id])
        outcomes = []
        for decision in sorted(taken):
            time.sleep(settings.act_ms / 1000)  # the adapter's call
            acted.append(decision)
            try:
                control.append_step(
                    {"drain_id": decision, "seq": 0, "state": "requested", "task_id": decision,
                     "recorded_at": now.isoformat(), "by": run_id}
                )  # fmt: skip
            except ControlConflict:
                refused += 1
            outcomes.append((decision, f"ok: {run_id}"))
        control.record_outcomes(outcomes, now)
    out.put((run_id, acted, refused, began, time.time()))


def _one_count(settings: ScaleBenchSettings, count: int) -> dict[str, Any]:
    schema = f"{settings.schema_prefix}_{count}_{uuid.uuid4().hex[:8]}"
    control = ControlStore(settings.control_url, schema)
    control.migrate()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Barrier(count)  # every worker imported and connected before the clock starts
    procs = [
        ctx.Process(target=_worker, args=(settings.control_url, schema, settings, f"w{i}", ready, out))
        for i in range(count)
    ]
    try:
        for proc in procs:
            proc.start()
        results = []
        for _ in procs:
            results.append(out.get(timeout=600))
        wall = max(r[4] for r in results) - min(r[3] for r in results)
        for proc in procs:
            proc.join(30)
        total = settings.batches * settings.per_batch
        acted = Counter(d for _run, done, *_ in results for d in done)
        ids = [f"b{b:04d}-d{d:03d}" for b in range(settings.batches) for d in range(settings.per_batch)]
        held = control.claims(ids)
        return {
            "workers": count,
            "decisions": total,
            "seconds": round(wall, 3),
            "decisions_per_hour": round(total / wall * 3600),
            "lost": sum(1 for d in ids if held.get(d, {}).get("outcome") is None),
            "duplicate_actions": sum(n - 1 for n in acted.values() if n > 1),
            "steps_refused": sum(r[2] for r in results),
            "failed_workers": sum(1 for p in procs if p.exitcode != 0),
            "per_worker": {r[0]: len(r[1]) for r in sorted(results)},
        }
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        control.transaction(lambda cur: cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE"), "dropping")


def run_scale_bench(settings: ScaleBenchSettings) -> dict[str, Any]:
    """Each count `rounds` times, the counts alternating, so a machine whose load drifts during
    the run weighs on every count alike; each count's run of median rate is reported, with
    every round's rate and the load average before and after (a shared machine's other work
    takes the cores the workers wait for)."""
    counts = sorted(set(settings.workers) | {1})
    load_before = [round(x, 2) for x in os.getloadavg()]
    rounds: dict[str, list[dict[str, Any]]] = {str(n): [] for n in counts}
    for _ in range(settings.rounds):
        for n in counts:
            rounds[str(n)].append(_one_count(settings, n))
    runs = {
        n: sorted(done, key=lambda r: r["decisions_per_hour"])[len(done) // 2] for n, done in rounds.items()
    }
    base = runs["1"]["decisions_per_hour"]
    speedups = {n: round(r["decisions_per_hour"] / base, 3) for n, r in runs.items() if n != "1"}
    return {
        "bench": "scale",
        "measures": "control-state claims, journal and outcomes by N worker processes (not the whole tick)",
        "act_ms": settings.act_ms,
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "rounds": {n: [r["decisions_per_hour"] for r in done] for n, done in rounds.items()},
        "runs": runs,
        "speedup_over_1": speedups,
        "target_speedup_2": TARGET_SPEEDUP,
        "within_target": speedups.get("2", 0.0) >= TARGET_SPEEDUP
        and all(
            r["lost"] == 0 and r["duplicate_actions"] == 0 and r["failed_workers"] == 0 for r in runs.values()
        ),
    }
