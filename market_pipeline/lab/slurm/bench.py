"""`market-pipeline bench slurm`: the slurm backend against real Slurm daemons.

It starts a local cluster (4 nodes x 8 GPUs by default) in a temporary home, submits an
openb-shaped workload (200 jobs, durations scaled down) and, while the jobs run:
- times `list_tasks` and `read_samples` (median, p95) next to a bare `squeue --json`
  (the baseline: what one CLI round trip costs), and every fifth poll the rigid guarantee's
  passes on the queue (`drain.queue_rules`: rule 4's, and rules 5 and 6's, in shadow mode so
  that the workload runs as submitted);
- drains the drainable jobs of one node through the real drain executor (warning, checkpoint,
  SIGTERM, release check), measuring warning -> released against the notice (`KillWait`);
- requeues the drained jobs and measures requeue -> running again;
- powers the drained node down and up again.
Then it waits for every job to finish and checks: no job lost (each ends COMPLETED in the
job completion log) and the metered seconds (billing's `meter_window` over the adapter's
task events) equal Slurm's recorded run seconds (GPU-seconds, per run).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from market_pipeline.billing.metering import HourWindow, meter_window
from market_pipeline.config.model import MarketPipelineConfig
from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.protocol import InMemoryAuditStore
from market_pipeline.drain.queue_rules import close_to_drainable, keep_off_drainable
from market_pipeline.drain.recovery import ENDED_BY_DRAIN, requeue_drained
from market_pipeline.drain.steps import DrainTiming
from market_pipeline.hardware.protocol import ResourceClass
from market_pipeline.hardware.slurm.adapter import SlurmAdapter, split_task_id
from market_pipeline.hardware.slurm.cluster import ClusterSpec, LocalCluster
from market_pipeline.hardware.slurm.workload import cluster_kinds, submit, workload_specs

UTC = timezone.utc


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else float("nan")


def _p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 4)


def _timed(fn: Callable[[], Any], into: list[float]) -> Any:
    started = time.perf_counter()
    out = fn()
    into.append(time.perf_counter() - started)
    return out


def run_slurm_bench(
    config: MarketPipelineConfig,
    *,
    nodes: int = 4,
    gpus_per_node: int = 8,
    jobs: int = 200,
    time_scale: float = 400.0,
    max_job_seconds: int = 20,
    seed: int = 7,
    home: Path | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mp-slurm-bench-") as tmp:
        cluster = LocalCluster(
            home or Path(tmp), ClusterSpec.two_types(nodes, gpus_per_node, min_job_age_seconds=120)
        )
        started = time.perf_counter()
        cluster.up()
        up_seconds = time.perf_counter() - started
        try:
            report = _bench(cluster, config, jobs, time_scale, max_job_seconds, seed)
        finally:
            cluster.down()
        report["cluster_up_seconds"] = round(up_seconds, 3)
        report["total_seconds"] = round(time.perf_counter() - started, 1)
        return report


def _bench(
    cluster: LocalCluster,
    config: MarketPipelineConfig,
    jobs: int,
    time_scale: float,
    max_job_seconds: int,
    seed: int,
    drain_backlog: int = 8,
) -> dict[str, Any]:
    adapter = SlurmAdapter.for_cluster(cluster, config)
    kinds = cluster_kinds([(n.gpu_type, n.gpus) for n in adapter.slurm_nodes()], adapter.namer)
    specs = workload_specs(
        config.tenants, kinds, jobs, seed=seed, time_scale=time_scale, max_seconds=max_job_seconds
    )
    job_ids = submit(cluster.client(), specs, cluster.home / "jobs")
    gpus_of = {job_id: spec.gpus for job_id, spec in zip(job_ids, specs, strict=True)}
    bench_start = datetime.now(UTC)

    list_s: list[float] = []
    samples_s: list[float] = []
    squeue_s: list[float] = []
    rules_s: list[float] = []
    kept: list[int] = []
    shadow = config.model_copy(update={"loop": config.loop.model_copy(update={"shadow_mode": True})})

    def rules() -> None:
        close_to_drainable(adapter, shadow)
        answer = keep_off_drainable(adapter, shadow)
        kept.append(len(answer.kept) if answer is not None else 0)

    def poll() -> list:
        _timed(cluster.client().squeue_jobs, squeue_s)
        if len(squeue_s) % 5 == 1:
            _timed(rules, rules_s)
        tasks = _timed(adapter.list_tasks, list_s)
        now = datetime.now(UTC)
        _timed(
            lambda: adapter.read_samples(now - timedelta(minutes=1), now + timedelta(minutes=1)), samples_s
        )
        return tasks

    # -- a drain of one node's drainable jobs, through the real drain executor -----------------
    kill_wait = cluster.spec.kill_wait_seconds
    timing = DrainTiming(
        warn_seconds=3.0,
        checkpoint_timeout_seconds=5.0,
        terminate_timeout_seconds=kill_wait + 3.0,
        max_total_seconds=60.0,
        kill_timeout_seconds=10.0,
        verify_timeout_seconds=10.0,
        poll_seconds=0.1,
    )
    drained: list[dict[str, Any]] = []
    # The drain starts once the backlog is short (at most `drain_backlog` jobs pending), so
    # that requeue -> running measures Slurm's requeue, not a wait for GPUs behind 150 jobs.
    target = None
    pending = 0
    deadline = time.monotonic() + 180
    while target is None and time.monotonic() < deadline:
        tasks = poll()
        pending = sum(1 for j in adapter.slurm_jobs() if j.state == "PENDING")
        by_node: dict[str, list] = {}
        for t in tasks:
            if t.resource_class is ResourceClass.DRAINABLE and t.checkpointable:
                by_node.setdefault(t.node_id, []).append(t)
        if by_node and pending <= drain_backlog:
            target = max(by_node, key=lambda n: len(by_node[n]))
        else:
            time.sleep(0.3)
    if target is None:
        raise RuntimeError("no drainable job ran with a short backlog within 180 s")
    adapter.cordon(target)
    victims = by_node[target]
    executor = DrainExecutor(adapter, InMemoryAuditStore(), timing)
    for task in victims:
        report = executor.run(DrainRequest(f"bench-{task.task_id}", task))
        released = report.task_ended_at or datetime.now(UTC)
        drained.append(
            {
                "task_id": task.task_id,
                "outcome": report.outcome,
                "checkpoint": report.checkpoint,
                "warning_to_released_s": round((released - report.drain_signal_at).total_seconds(), 3)
                if report.drain_signal_at
                else None,
                "drain_seconds": round(report.seconds, 3),
            }
        )
        poll()

    # -- requeue the drained jobs: they resume from their checkpoints elsewhere -----------------
    requeued_at: dict[str, datetime] = {}
    for item, task in zip(drained, victims, strict=True):
        if item["outcome"] not in ENDED_BY_DRAIN:
            item["requeue"] = "not drained"
            continue
        outcome = requeue_drained(adapter, task, ("scale_down: bench",))
        item["requeue"] = outcome.status.value
        if outcome.ok:
            requeued_at[split_task_id(item["task_id"])[0]] = datetime.now(UTC)
    # -- and power the drained node down (power_down_asap waits for its guaranteed jobs)
    power_off = adapter.power_off(target)
    power_off_at = time.monotonic()
    powered = {"off_s": None, "on_s": None, "power_off": power_off.status.value}
    finish_deadline = time.monotonic() + max(300, jobs * max_job_seconds / (len(kinds) * 8) * 3)
    power_on_at = None
    while time.monotonic() < finish_deadline:
        poll()
        node = next(n for n in adapter.slurm_nodes() if n.name == target)
        if powered["off_s"] is None and node.powered_off and "POWERED_DOWN" in node.flags:
            powered["off_s"] = round(time.monotonic() - power_off_at, 2)
            power_on_at = time.monotonic()
            powered["power_on"] = adapter.power_on(target).status.value
        if (
            power_on_at is not None
            and powered["on_s"] is None
            and not node.powered_off
            and not node.powering_up
        ):
            if node.state in {"idle", "mixed", "allocated"}:
                powered["on_s"] = round(time.monotonic() - power_on_at, 2)
        live = [
            j
            for j in adapter.slurm_jobs()
            if j.job_id in gpus_of and j.state in {"RUNNING", "PENDING", "COMPLETING", "CONFIGURING"}
        ]
        if not live and powered["off_s"] is not None and powered["on_s"] is not None:
            break
        time.sleep(0.3)
    bench_end = datetime.now(UTC) + timedelta(seconds=1)

    # -- lost jobs and metered seconds ----------------------------------------------------------
    runs = adapter.jobcomp_runs()
    # requeue -> running again: the requeued job's next run start as Slurm recorded it (whole
    # seconds, so up to 1 s early; a run that ended before a poll saw it still counts)
    requeue_s: list[float] = []
    for job_id, at in requeued_at.items():
        starts = [r.start for r in runs if r.job_id == job_id and r.start >= at - timedelta(seconds=1)]
        if starts:
            requeue_s.append(max(0.0, (min(starts) - at).total_seconds()))
    final_state: dict[str, str] = {}
    for run in sorted(runs, key=lambda r: r.end):
        final_state[run.job_id] = run.state
    lost = sorted(j for j in job_ids if final_state.get(j) != "COMPLETED")
    slurm_gpu_seconds = sum(r.seconds * gpus_of[r.job_id] for r in runs if r.job_id in gpus_of)
    events = adapter.read_task_events(bench_start - timedelta(minutes=5), bench_end)
    catalog = adapter.task_catalog(sorted(set(events["task_id"].to_list())))
    pools = {n.pool_id: (n.gpu_model, n.zone) for n in adapter.list_nodes()}
    for task in catalog:
        pools.setdefault(task.pool_id, (task.pool_id.split("@")[0], task.pool_id.split("@")[-1]))
    metered = 0.0
    hour = (bench_start - timedelta(minutes=5)).replace(minute=0, second=0, microsecond=0)
    while hour < bench_end:
        window = HourWindow(hour, hour + timedelta(hours=1))
        intervals = meter_window(events, catalog, window, pools)
        if intervals.height:
            metered += float((intervals["ended_at"] - intervals["started_at"]).dt.total_seconds().sum())
        hour += timedelta(hours=1)
    observed_runs = {t.task_id for t in catalog}
    unobserved = [
        r
        for r in runs
        if r.job_id in gpus_of and f"{r.job_id}@{int(r.start.timestamp())}" not in observed_runs
    ]
    warn_to_released = [d["warning_to_released_s"] for d in drained if d["warning_to_released_s"] is not None]
    return {
        "backend": "slurm",
        "nodes": len(cluster.spec.nodes()),
        "gpus": sum(g.nodes * g.gpus_per_node for g in cluster.spec.groups),
        "jobs": len(job_ids),
        "runs": len(runs),
        "list_tasks_median_s": _median(list_s),
        "list_tasks_p95_s": _p95(list_s),
        "read_samples_median_s": _median(samples_s),
        "read_samples_p95_s": _p95(samples_s),
        "baseline_squeue_json_median_s": _median(squeue_s),
        "guarantee_queue_passes_median_s": _median(rules_s),
        "guarantee_queue_passes_p95_s": _p95(rules_s),
        "guarantee_queue_passes": len(rules_s),
        "nodes_kept_from_drainable_max": max(kept, default=0),
        "polls": len(list_s),
        "kill_wait_s": kill_wait,
        "drained_node": target,
        "pending_jobs_at_drain": pending,
        "drains": len(drained),
        "drain_details": drained,
        "drain_outcomes": sorted({d["outcome"] for d in drained}),
        "warning_to_released_max_s": max(warn_to_released) if warn_to_released else None,
        "warning_to_released_target_s": kill_wait + 2,
        "requeue_to_running_s": [round(s, 2) for s in sorted(requeue_s)],
        "requeue_to_running_max_s": round(max(requeue_s), 2) if requeue_s else None,
        "requeues_not_running": len(requeued_at) - len(requeue_s),
        "power": powered,
        "lost_jobs": len(lost),
        "lost_job_ids": lost[:10],
        "unobserved_runs": len(unobserved),
        "metered_gpu_seconds": metered,
        "slurm_gpu_seconds": slurm_gpu_seconds,
        "double_billed_gpu_seconds": max(0.0, metered - slurm_gpu_seconds),
        "unbilled_gpu_seconds": max(0.0, slurm_gpu_seconds - metered),
    }
