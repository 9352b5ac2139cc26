"""The slurm backend against real Slurm daemons: a local cluster (4 nodes x 2 GPUs of two
types) started once for this module under a temporary home.

Skipped, with the reason, where the Slurm binaries are not installed (`.ci/run` installs
them) or the suite does not run as root (slurmd must).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

import polars as pl
import pytest

from market_pipeline.billing.metering import HourWindow, meter_window
from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.protocol import InMemoryAuditStore
from market_pipeline.drain.recovery import requeue_drained
from market_pipeline.drain.steps import DrainTiming
from market_pipeline.hardware.protocol import (
    DrainableClosure,
    NodeState,
    OutcomeStatus,
    ResourceClass,
    TaskInfo,
)
from market_pipeline.hardware.slurm.adapter import SlurmAdapter, split_task_id
from market_pipeline.hardware.slurm.client import SlurmUnavailable
from market_pipeline.hardware.slurm.cluster import ClusterSpec, LocalCluster, NodeGroup, missing_binaries
from market_pipeline.hardware.slurm.workload import JobSpec, submit

# what every module on a local cluster needs (the others import it)
NEEDS_SLURM = [
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Slurm not installed: missing {missing_binaries()}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs slurmd, which needs root"),
]
pytestmark = NEEDS_SLURM
KILL_WAIT = 2
T = TypeVar("T")
UTC = timezone.utc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        groups=(NodeGroup("a100_80gb", "cn-hangzhou-a", 2, 2, 8), NodeGroup("h800", "cn-beijing-b", 2, 2, 8)),
        kill_wait_seconds=KILL_WAIT,
        min_job_age_seconds=120,
        suspend_timeout_seconds=2,
    )
    yield from running_cluster(tmp_path_factory, "slurm", spec)


def running_cluster(factory: pytest.TempPathFactory, name: str, spec: ClusterSpec) -> Iterator[LocalCluster]:
    """A module's local cluster under a fresh temporary home, stopped after its tests."""
    local = LocalCluster(factory.mktemp(name), spec)
    local.up()
    yield local
    local.down()


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout}s")


def run_jobs(cluster: LocalCluster, adapter: SlurmAdapter, *specs: JobSpec) -> list[TaskInfo]:
    ids = submit(cluster.client(), specs, cluster.home / "jobs")

    def running() -> list[TaskInfo] | None:
        tasks = {split_task_id(t.task_id)[0]: t for t in adapter.list_tasks()}
        return [tasks[i] for i in ids] if all(i in tasks for i in ids) else None

    tasks = wait_for(running, 30, f"jobs {ids} running")

    def ready() -> bool:  # checkpointable jobs have declared their signal handlers
        jobs = {j.job_id: j for j in adapter.slurm_jobs()}
        return all("checkpoint" in jobs[i].comment for i, s in zip(ids, specs, strict=True) if s.drainable)

    wait_for(ready, 20, "signal handlers declared")
    return tasks


def job_log(cluster: LocalCluster, task: TaskInfo) -> str:
    path = cluster.home / "jobs" / f"{split_task_id(task.task_id)[0]}.log"
    return path.read_text() if path.exists() else ""


def timing() -> DrainTiming:
    return DrainTiming(
        warn_seconds=2.0,
        checkpoint_timeout_seconds=5.0,
        terminate_timeout_seconds=KILL_WAIT + 5.0,
        max_total_seconds=30.0,
        kill_timeout_seconds=10.0,
        verify_timeout_seconds=10.0,
        poll_seconds=0.1,
    )


def quick_drains(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> tuple[MarketPipelineConfig, SlurmAdapter]:
    """The config with drains quick enough for a test (no landing cool-down, a 1 s warning, short
    checkpoint and terminate waits) and an adapter of the cluster under it."""
    for key, value in (("LANDING_COOLDOWN_MINUTES", "0"), ("WARN_SECONDS", "1")):
        monkeypatch.setenv(f"MP__GUARDRAILS__TASK_DRAIN__{key}", value)
    monkeypatch.setenv("MP__GUARDRAILS__TASK_DRAIN__CHECKPOINT_TIMEOUT_SECONDS", "5")
    monkeypatch.setenv("MP__GUARDRAILS__TASK_DRAIN__TERMINATE_TIMEOUT_SECONDS", str(KILL_WAIT + 5))
    config = load_config()
    return config, SlurmAdapter.for_cluster(cluster, config, poll_seconds=0.1)


def test_a_tenants_jobs_run_with_their_gpus_class_and_allocation(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    nodes = {n.node_id: n for n in adapter.list_nodes()}
    assert {n.pool_id for n in nodes.values()} == {"A100-80GB@cn-hangzhou-a", "H800@cn-beijing-b"}
    assert all(n.gpus == 2 and n.state is NodeState.ON for n in nodes.values())
    drainable, guaranteed = run_jobs(
        cluster,
        adapter,
        JobSpec("acme-research", "h800", 2, 30, drainable=True),
        JobSpec("delta-vision", "h800", 1, 30, drainable=False),
    )
    assert (drainable.tenant_id, drainable.resource_class, drainable.checkpointable) == (
        "acme-research",
        ResourceClass.DRAINABLE,
        True,
    )
    assert (guaranteed.tenant_id, guaranteed.resource_class, guaranteed.checkpointable) == (
        "delta-vision",
        ResourceClass.GUARANTEED,
        False,
    )
    assert drainable.pool_id == "H800@cn-beijing-b" and len(drainable.gpu_uuids) == 2
    assert drainable.gpu_uuids[0].startswith(drainable.node_id + ":gpu")
    now = datetime.now(UTC)
    samples = adapter.read_samples(now - timedelta(minutes=1), now + timedelta(minutes=1))
    samples = samples.filter(samples["ts"] == samples["ts"].max())  # the one taken now
    held = samples.filter(samples["task_id"].is_not_null())
    assert sorted(held["gpu_uuid"].to_list()) == sorted(drainable.gpu_uuids + guaranteed.gpu_uuids)
    assert set(held["sm_util_pct"].to_list()) == {100.0}
    assert samples.height == 8 and set(samples.filter(samples["task_id"].is_null())["sm_util_pct"]) == {0.0}
    # a closed window (the telemetry job reads the hour after it closed) has the logged samples
    logged = adapter.read_samples(now - timedelta(minutes=10), now)
    assert logged.height >= 8 and logged["ts"].max() < now
    # a job without USR1/USR2 handlers gets the notice recorded, not a signal that would kill it
    warned = adapter.warn_task(guaranteed.task_id, 5)
    assert warned.status is OutcomeStatus.UNSUPPORTED and "not signalled" in warned.detail
    time.sleep(0.5)
    assert guaranteed.task_id in {t.task_id for t in adapter.list_tasks()}
    for task in (drainable, guaranteed):
        assert adapter.terminate_task(task.task_id, KILL_WAIT + 5).ok


def test_the_queue_reports_what_waits_per_gpu_model_and_what_drains_could_free(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    """Both `A100-80GB` nodes busy (a guaranteed and a drainable 2-GPU job): a guaranteed
    1-GPU job and a drainable 1-GPU job pend. The queue row of the model counts both, the
    guaranteed one apart with its wait, and the 2 GPUs drainable work holds there: what the
    fleet inventory records for the guarantee's check and reach."""
    ids = submit(
        cluster.client(),
        [
            JobSpec("delta-vision", "a100_80gb", 2, 60, drainable=False),
            JobSpec("acme-research", "a100_80gb", 2, 60, drainable=True),
        ],
        cluster.home / "jobs",
    )
    try:
        wait_for(
            lambda: len([t for t in adapter.list_tasks() if t.pool_id.startswith("A100")]) == 2,
            30,
            "both running",
        )
        ids += submit(
            cluster.client(),
            [
                JobSpec("delta-vision", "a100_80gb", 1, 60, drainable=False),
                JobSpec("acme-research", "a100_80gb", 1, 60, drainable=True),
            ],
            cluster.home / "jobs",
        )
        row = wait_for(
            lambda: (
                adapter.pending_summary().get("A100-80GB", {}).get("jobs") == 2
                and adapter.pending_summary()["A100-80GB"]
            ),
            30,
            "two jobs pending",
        )
        assert (row["gpus"], row["guaranteed_jobs"], row["guaranteed_gpus"]) == (2.0, 1.0, 1.0)
        assert 0.0 <= row["guaranteed_oldest_wait_s"] < 60.0
        assert row["drainable_running_gpus"] == 2.0
        assert "H800" not in adapter.pending_summary()  # nothing waits there
    finally:
        for job_id in ids:
            cluster.client().cancel(job_id)
        wait_for(lambda: not any(t.pool_id.startswith("A100") for t in adapter.list_tasks()), 30, "jobs gone")


def test_a_waiting_guaranteed_job_gets_room_drained_for_it_and_starts_there(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rigid guarantee on real daemons: both `A100-80GB` nodes busy (a guaranteed and a
    drainable 2-GPU job), a drainable job asking a whole node queues, then a guaranteed one,
    and another guaranteed job is held by its tenant. The queue reports the waiting
    guaranteed job as a waiting task, never the held one (no drain would start it), nor
    the held one in the model's queue row; the live drain planner drains the drainable job
    in its way (not the guaranteed one), and the waiting job, not the drainable one queued
    before it (the guaranteed partition's higher PriorityTier), starts on the node that
    freed."""
    from market_pipeline.drain.service import execute_decision, plan_and_record
    from market_pipeline.warehouse import open_warehouse

    config, adapter = quick_drains(cluster, monkeypatch)
    client, jobs = cluster.client(), cluster.home / "jobs"
    rigid, elastic = run_jobs(
        cluster,
        adapter,
        JobSpec("delta-vision", "a100_80gb", 2, 120, drainable=False),
        JobSpec("acme-research", "a100_80gb", 2, 120, drainable=True),
    )
    ids = [split_task_id(t.task_id)[0] for t in (rigid, elastic)]
    try:
        held = client.submit(
            ["--hold", *JobSpec("ember-ai", "a100_80gb", 1, 30, drainable=False).sbatch_args(jobs)]
        )
        ids.append(held)
        [queued_id] = submit(client, [JobSpec("ember-ai", "a100_80gb", 2, 30, drainable=True)], jobs)
        ids.append(queued_id)
        [waiting_id] = submit(client, [JobSpec("delta-vision", "a100_80gb", 2, 30, drainable=False)], jobs)
        ids.append(waiting_id)
        [waiting] = wait_for(
            lambda: [w for w in adapter.waiting_guaranteed() if w.task_id == waiting_id] or None,
            30,
            "the guaranteed job waiting",
        )
        assert (waiting.tenant_id, waiting.gpu_model, waiting.num_gpu, waiting.gpu_milli) == (
            "delta-vision",
            "A100-80GB",
            2,
            1000,
        )
        assert held not in {w.task_id for w in adapter.waiting_guaranteed()}
        row = adapter.pending_summary()["A100-80GB"]
        assert (row["jobs"], row["guaranteed_jobs"], row["guaranteed_gpus"]) == (2.0, 1.0, 2.0)

        store = open_warehouse(tmp_path / "w.duckdb")
        decisions, _, _ = plan_and_record(store, adapter, config, wall_now=datetime.now(UTC))
        [decision] = [d for d in decisions if d.allowed]
        assert decision.task.task_id == elastic.task_id, decisions
        assert f"guaranteed task {waiting_id} waits" in decision.reasons[0]
        report = execute_decision(store, adapter, config, decision.decision_id, lease_dir=tmp_path)
        assert report.outcome in ("terminated", "killed"), report
        started = wait_for(
            lambda: next(
                (t for t in adapter.list_tasks() if split_task_id(t.task_id)[0] == waiting_id), None
            ),
            30,
            "the guaranteed job running",
        )
        assert started.node_id == elastic.node_id
        assert queued_id not in {split_task_id(t.task_id)[0] for t in adapter.list_tasks()}
        assert rigid.task_id in {t.task_id for t in adapter.list_tasks()}  # never drained
    finally:
        for job_id in ids:
            client.cancel(job_id)
        wait_for(lambda: not any(t.pool_id.startswith("A100") for t in adapter.list_tasks()), 30, "jobs gone")


def test_drainable_work_keeps_off_a_model_where_guaranteed_work_waits_and_comes_back_after(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    """Rule 4 of the rigid guarantee on Slurm's own queue. One `A100-80GB` node runs a
    guaranteed 2-GPU job, the other a short and a long drainable 1-GPU job; a guaranteed
    2-GPU job waits, then a drainable 1-GPU job, and another drainable one whose tenant set
    its own begin time. Without the rule Slurm's backfill starts the pending drainable job
    on the GPU the short one frees, which the waiting guaranteed job cannot use alone. With
    it (`drain.service.close_to_drainable`, the `drain_requests` asset's pass) the model is
    closed, the pending drainable job is deferred one lease (two control ticks) and does not
    start there, it still counts as waiting demand, and the tenant's own begin time is left
    alone. A drainable job submitted before the next pass gets the same begin time at
    submission from the shipped job_submit plugin (the pass publishes the closure next to
    slurm.conf), a drainable job of an open model none. Once the guaranteed job has started (the
    long job ended) the model opens and the deferred jobs' begin times are back to now."""
    from market_pipeline.drain.queue_rules import close_to_drainable

    config = load_config()
    client, jobs = cluster.client(), cluster.home / "jobs"
    rigid = run_jobs(cluster, adapter, JobSpec("delta-vision", "a100_80gb", 2, 120, drainable=False))
    short, long = run_jobs(
        cluster,
        adapter,
        JobSpec("acme-research", "a100_80gb", 1, 8, drainable=True),
        JobSpec("acme-research", "a100_80gb", 1, 120, drainable=True),
    )
    ids = [split_task_id(t.task_id)[0] for t in (*rigid, short, long)]
    try:
        [waiting_id] = submit(client, [JobSpec("delta-vision", "a100_80gb", 2, 30, drainable=False)], jobs)
        [queued_id] = submit(client, [JobSpec("ember-ai", "a100_80gb", 1, 30, drainable=True)], jobs)
        later = client.submit(
            ["--begin=now+3600", *JobSpec("ember-ai", "a100_80gb", 1, 30, drainable=True).sbatch_args(jobs)]
        )
        ids += [waiting_id, queued_id, later]
        wait_for(lambda: any(w.task_id == waiting_id for w in adapter.waiting_guaranteed()), 30, "it waits")
        shadow = adapter.close_to_drainable({"A100-80GB"}, 600.0, act=False)  # shadow mode: told, not done
        assert shadow.deferred == (queued_id,) and not shadow.released
        assert all(
            j.eligible_time is None or j.eligible_time <= datetime.now(UTC)
            for j in adapter.slurm_jobs()
            if j.job_id == queued_id
        )
        before = datetime.now(UTC)
        closure = close_to_drainable(adapter, config)
        assert closure is not None and closure.closed_models == ("A100-80GB",)
        assert closure.deferred == (queued_id,) and not closure.failed, closure
        lease = 2 * config.loop.tick_minutes * 60
        begin = {j.job_id: j.eligible_time for j in adapter.slurm_jobs()}
        assert begin[queued_id] is not None
        assert abs((begin[queued_id] - before).total_seconds() - lease) <= 3
        # a drainable job submitted before the next pass: the job_submit plugin (job_submit.lua)
        # gives it the published lease's begin time at submission; a guaranteed one is untouched
        [fresh] = submit(client, [JobSpec("ember-ai", "a100_80gb", 1, 30, drainable=True)], jobs)
        [other] = submit(client, [JobSpec("ember-ai", "h800", 1, 5, drainable=True)], jobs)
        ids += [fresh, other]
        begin = {j.job_id: j.eligible_time for j in adapter.slurm_jobs()}
        assert begin[fresh] is not None and abs((begin[fresh] - begin[queued_id]).total_seconds()) <= 1
        assert begin[other] is None or begin[other] <= datetime.now(UTC) + timedelta(seconds=2)
        # the short job ends and frees one GPU: nothing starts there
        wait_for(
            lambda: short.task_id not in {t.task_id for t in adapter.list_tasks()} or None,
            30,
            "the short job ending",
        )
        time.sleep(6)  # three of the scheduler's passes (sched_interval, bf_interval = 2 s)
        running = {split_task_id(t.task_id)[0] for t in adapter.list_tasks()}
        assert queued_id not in running and waiting_id not in running
        assert fresh not in running
        row = adapter.pending_summary()["A100-80GB"]
        assert (row["jobs"], row["guaranteed_jobs"]) == (3.0, 1.0)  # the deferred jobs are still demand
        # the long job ends: the guaranteed job starts, the model opens, the deferral is undone
        client.cancel(split_task_id(long.task_id)[0])
        wait_for(
            lambda: waiting_id in {split_task_id(t.task_id)[0] for t in adapter.list_tasks()} or None,
            30,
            "the guaranteed job running",
        )
        reopened = close_to_drainable(adapter, config)
        assert reopened is not None and reopened.closed_models == ()
        assert set(reopened.released) == {queued_id, fresh}  # the plugin's deferral is the pass's too
        [after_open] = submit(client, [JobSpec("ember-ai", "a100_80gb", 1, 5, drainable=True)], jobs)
        ids.append(after_open)
        begins = {j.job_id: j.eligible_time for j in adapter.slurm_jobs()}[after_open]
        assert begins is None or begins <= datetime.now(UTC) + timedelta(seconds=2)  # the lease is void
        after = {j.job_id: j.eligible_time for j in adapter.slurm_jobs()}
        assert after[queued_id] is not None and after[queued_id] <= datetime.now(UTC)
        assert after[later] == begin[later] and after[later] > datetime.now(UTC) + timedelta(minutes=50)
        assert close_to_drainable(adapter, config) == DrainableClosure()  # nothing of ours left
    finally:
        for job_id in ids:
            client.cancel(job_id)
        wait_for(lambda: not any(t.pool_id.startswith("A100") for t in adapter.list_tasks()), 30, "jobs gone")


def test_drain_warns_checkpoints_terminates_and_the_requeued_job_resumes_elsewhere(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    [task] = run_jobs(cluster, adapter, JobSpec("ember-ai", "a100_80gb", 1, 60, drainable=True))
    time.sleep(0.5)  # a few steps of work to checkpoint
    assert adapter.cordon(task.node_id).ok
    try:
        _drain_and_requeue(cluster, adapter, task)
    finally:
        adapter.uncordon(task.node_id)


def _drain_and_requeue(cluster: LocalCluster, adapter: SlurmAdapter, task: TaskInfo) -> None:
    node = next(n for n in adapter.list_nodes() if n.node_id == task.node_id)
    assert node.cordoned and task.task_id in {t.task_id for t in adapter.list_tasks()}  # still runs

    report = DrainExecutor(adapter, InMemoryAuditStore(), timing()).run(DrainRequest("d-1", task))
    assert (report.outcome, report.checkpoint) == ("terminated", "ok")
    released = (report.task_ended_at - report.drain_signal_at).total_seconds()
    assert released <= KILL_WAIT + 5  # the notice; the bench holds the 2 s target on a quiet run
    log = job_log(cluster, task)
    assert log.index("(warning)") < log.index("(request)") < log.index("(term)")

    started = time.monotonic()
    assert requeue_drained(adapter, task, ("scale_down: the scaler wants node empty",)).ok
    again = wait_for(
        lambda: [
            t for t in adapter.list_tasks() if split_task_id(t.task_id)[0] == split_task_id(task.task_id)[0]
        ],
        35,
        "requeued job running again",
    )[0]
    assert time.monotonic() - started <= 30
    assert again.task_id != task.task_id and again.node_id != task.node_id  # its node is drained
    resumed = wait_for(
        lambda: "resume step=" in job_log(cluster, task) and job_log(cluster, task), 15, "resume"
    )
    saved = int(resumed.split("(term)")[0].rsplit("checkpoint step=", 1)[1].split()[0])
    assert f"resume step={saved}" in resumed and saved > 0

    now = datetime.now(UTC)
    events = adapter.read_task_events(now - timedelta(minutes=5), now + timedelta(seconds=5))
    first = events.filter(events["task_id"] == task.task_id)["event"].to_list()
    assert first == ["start", "drain_signal", "drained"]
    assert events.filter(events["task_id"] == again.task_id)["event"].to_list() == ["start"]
    assert {t.task_id for t in adapter.task_catalog([task.task_id, again.task_id])} == {
        task.task_id,
        again.task_id,
    }

    # billing: the drained run carries its warning (billing stops at warning + grace), the
    # requeued run is metered as its own task of the same tenant
    hour = now.replace(minute=0, second=0, microsecond=0)
    catalog = adapter.task_catalog([task.task_id, again.task_id])
    pools = {t.pool_id: tuple(t.pool_id.split("@")) for t in catalog}
    ours = events.filter(events["task_id"].is_in([task.task_id, again.task_id]))
    intervals = pl.concat(
        meter_window(ours, catalog, HourWindow(start, start + timedelta(hours=1)), pools)
        for start in (hour - timedelta(hours=1), hour)
    )
    runs = {r["task_id"]: r for r in intervals.iter_rows(named=True)}
    assert set(runs) == {task.task_id, again.task_id}
    assert {r["tenant_id"] for r in runs.values()} == {"ember-ai"}
    assert runs[task.task_id]["end_reason"] == "drained" and runs[task.task_id]["drain_signal_at"] is not None
    assert runs[again.task_id]["end_reason"] == "running" and runs[again.task_id]["drain_signal_at"] is None
    assert adapter.terminate_task(again.task_id, KILL_WAIT + 5).ok


def test_a_job_that_vanishes_mid_drain_is_gone(cluster: LocalCluster, adapter: SlurmAdapter) -> None:
    [task] = run_jobs(cluster, adapter, JobSpec("acme-research", "a100_80gb", 1, 60, drainable=True))
    assert adapter.warn_task(task.task_id, 5).ok
    cluster.client().cancel(split_task_id(task.task_id)[0])  # someone else's scancel
    wait_for(lambda: adapter._holding(split_task_id(task.task_id)[0]) is None, 10, "job gone")
    for outcome in (
        adapter.checkpoint_task(task.task_id, 2),
        adapter.terminate_task(task.task_id, 2),
        adapter.kill_task(task.task_id),
        adapter.warn_task(task.task_id, 2),
    ):
        assert outcome.status is OutcomeStatus.GONE, outcome
    assert adapter.verify_released(task.gpu_uuids, task.task_id).ok
    report = DrainExecutor(adapter, InMemoryAuditStore(), timing()).run(DrainRequest("d-gone", task))
    assert report.outcome == "gone"
    assert adapter.cordon("node99").status is OutcomeStatus.GONE


@pytest.mark.slow  # Slurm's own power-saving cadence: 15-30 s of waiting
def test_a_node_powers_down_and_up_through_the_shipped_programs(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    def state() -> NodeState:
        return next(n.state for n in adapter.list_nodes() if n.node_id == "node4")

    assert adapter.power_off("node4").ok
    wait_for(lambda: state() is NodeState.OFF and "POWERED_DOWN" in adapter.slurm_nodes()[3].flags, 20, "off")
    assert not (cluster.home / "run" / "slurmd-node4.pid").exists()  # SuspendProgram stopped it
    assert adapter.power_on("node4").ok
    wait_for(lambda: state() is NodeState.ON and not adapter.slurm_nodes()[3].flags, 20, "on again")
    assert adapter.power_on("node4").detail == "node4 is on"


def test_a_down_node_is_reported_and_never_acted_on(cluster: LocalCluster, adapter: SlurmAdapter) -> None:
    cluster.client().update_node("node2", "down", "broken fan")
    try:
        node = next(n for n in adapter.list_nodes() if n.node_id == "node2")
        assert node.state is NodeState.OFF and node.cordoned
        assert adapter.node_conditions()["node2"] == "state DOWN (broken fan)"
        for outcome in (adapter.cordon("node2"), adapter.power_off("node2"), adapter.uncordon("node2")):
            assert outcome.status is OutcomeStatus.REFUSED and "not acted on" in outcome.detail
    finally:
        cluster.client().update_node("node2", "resume")


def test_slurmctld_down_mid_drain_is_one_line_naming_it_and_nothing_is_lost(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    [task] = run_jobs(cluster, adapter, JobSpec("cobalt-labs", "a100_80gb", 1, 60, drainable=True))
    warned_before = datetime.now(UTC)
    assert adapter.warn_task(task.task_id, 5).ok  # the drain has begun
    cluster.stop_slurmctld()
    try:
        with pytest.raises(SlurmUnavailable, match="slurmctld is unreachable"):
            adapter.list_tasks()
        outcome = adapter.checkpoint_task(task.task_id, 5)
        assert outcome.status is OutcomeStatus.FAILED and "slurmctld" in outcome.detail
        cli = subprocess.run(
            [sys.executable, "-m", "market_pipeline.cli", "cluster", "status", "--home", str(cluster.home)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert cli.returncode == 1
        assert cli.stderr.strip().splitlines() == [cli.stderr.strip()]
        assert cli.stderr.startswith("error: ") and "slurmctld is unreachable" in cli.stderr
    finally:
        cluster.start_slurmctld()
    again = wait_for(lambda: _safe_tasks(adapter), 15, "slurmctld back")
    assert task.task_id in {t.task_id for t in again}  # the same run: the job survived
    # the drain, run again, finishes; the warning it keeps is the first one (billing's grace)
    report = DrainExecutor(adapter, InMemoryAuditStore(), timing()).run(DrainRequest("d-ctld", task))
    assert report.outcome == "terminated"
    now = datetime.now(UTC)
    events = adapter.read_task_events(now - timedelta(minutes=5), now + timedelta(seconds=5))
    signals = events.filter((events["task_id"] == task.task_id) & (events["event"] == "drain_signal"))
    assert signals.height == 1 and signals["ts"][0] < warned_before + timedelta(seconds=2)


def _safe_tasks(adapter: SlurmAdapter) -> list[TaskInfo] | None:
    try:
        return adapter.list_tasks() or None
    except SlurmUnavailable:
        return None


def test_cluster_home_is_self_contained(cluster: LocalCluster) -> None:
    conf = cluster.conf.read_text()
    assert f"SlurmdSpoolDir={cluster.home}/spool/%n" in conf and "SlurmdParameters=config_overrides" in conf
    assert str(Path(cluster.home, "munge", "munge.socket")) in conf


def test_a_job_that_completed_is_not_requeued(cluster: LocalCluster, adapter: SlurmAdapter) -> None:
    [job_id] = submit(
        cluster.client(), [JobSpec("acme-research", "h800", 1, 1, drainable=True)], cluster.home / "jobs"
    )
    wait_for(
        lambda: any(r.job_id == job_id and r.state == "COMPLETED" for r in adapter.jobcomp_runs()), 20, "done"
    )
    outcome = adapter.requeue_task(f"{job_id}@0")
    assert outcome.status is OutcomeStatus.UNSUPPORTED and "completed" in outcome.detail


@pytest.mark.slow
def test_the_drain_guardrail_holds_the_tenant_cap_and_the_disruption_budget_on_real_jobs(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scale-down cordons three nodes of two pools at once: the guardrail drains at most one
    node per pool (the disruption budget) and one job per tenant (the cap), on real jobs."""
    from market_pipeline.drain.service import execute_decision, plan_and_record
    from market_pipeline.warehouse import open_warehouse

    monkeypatch.setenv("MP__GUARDRAILS__TASK_DRAIN__TENANT_MAX_DRAINS_PER_DAY", "1")
    config, adapter = quick_drains(cluster, monkeypatch)
    # each job fills its node (2 GPUs), so the three land on three nodes
    tasks = run_jobs(
        cluster,
        adapter,
        JobSpec("acme-research", "a100_80gb", 2, 120, drainable=True),
        JobSpec("acme-research", "h800", 2, 120, drainable=True),
        JobSpec("ember-ai", "h800", 2, 120, drainable=True),
    )
    nodes = [t.node_id for t in tasks]
    assert len(set(nodes)) == 3
    for node in nodes:
        assert adapter.cordon(node).ok
    try:
        store = open_warehouse(tmp_path / "w.duckdb")
        now = datetime.now(UTC)
        decisions, _, _ = plan_and_record(store, adapter, config, wall_now=now, scale_down_nodes=nodes)
        assert {d.task.task_id for d in decisions} == {t.task_id for t in tasks}
        approved = [d for d in decisions if d.allowed]
        assert approved
        per_tenant = [d.task.tenant_id for d in approved]
        per_pool = [d.task.pool_id for d in approved]
        assert len(per_tenant) == len(set(per_tenant)) and len(per_pool) == len(set(per_pool))
        blocked = [d for d in decisions if not d.allowed]
        for decision in blocked:
            assert any(r.startswith(("tenant_cap", "pool_budget")) for r in decision.reasons), decision
        # the H800 pool's two cordoned busy nodes already use its budget: it bites
        assert any(r.startswith("pool_budget") for d in blocked for r in d.reasons), decisions
        # the approved drains run on the daemons; the cap still holds on the next tick's plan
        for decision in approved:
            report = execute_decision(store, adapter, config, decision.decision_id, lease_dir=tmp_path)
            assert report.outcome == "terminated"
        again, _, _ = plan_and_record(
            store, adapter, config, wall_now=now + timedelta(minutes=5), scale_down_nodes=nodes
        )
        capped = {d.task.tenant_id for d in approved}
        mine = [d for d in again if d.task.tenant_id in capped]
        assert mine  # acme's other job is still there, on its cordoned node
        for decision in mine:
            assert not decision.allowed and any(r.startswith("tenant_cap") for r in decision.reasons)
    finally:
        for node in nodes:
            adapter.uncordon(node)
        for task in adapter.list_tasks():
            adapter.terminate_task(task.task_id, KILL_WAIT + 5)


def test_munge_unreachable_is_one_line_naming_it_and_nothing_is_acted_on(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    # the module's cluster is shared: earlier tests may leave other nodes cordoned, so the
    # target is a node that is not, and only its state is judged
    target = next(n.node_id for n in adapter.list_nodes() if not n.cordoned)
    cluster.stop_munge()
    try:
        with pytest.raises(SlurmUnavailable, match="munge is unreachable"):
            adapter.list_nodes()
        outcome = adapter.cordon(target)
        assert outcome.status is OutcomeStatus.FAILED and "munge is unreachable" in outcome.detail
        cli = subprocess.run(
            [sys.executable, "-m", "market_pipeline.cli", "cluster", "status", "--home", str(cluster.home)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert cli.returncode == 1 and cli.stderr.count("\n") == 1, cli.stderr
        assert cli.stderr.startswith("error: ") and "munge is unreachable" in cli.stderr
    finally:
        cluster.start_munge()
    wait_for(lambda: _safe_nodes(adapter), 20, "munge back")
    # the cordon asked while munge was down never happened: no DRAIN on the node (judged on
    # Slurm's flags: a node slurmctld could not ping while munge was down may read
    # NOT_RESPONDING for a moment, which the adapter lists as cordoned too)
    [node] = [n for n in adapter.slurm_nodes() if n.name == target]
    assert not node.drained, node


def _safe_nodes(adapter: SlurmAdapter) -> list | None:
    try:
        return adapter.list_nodes() or None
    except SlurmUnavailable:
        return None
