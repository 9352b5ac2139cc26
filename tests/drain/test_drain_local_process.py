"""Drains of real OS processes through the `local-process` backend."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.protocol import InMemoryAuditStore
from market_pipeline.drain.steps import DrainTiming
from market_pipeline.drain.store import WarehouseAuditStore
from market_pipeline.hardware.local_process.adapter import LocalProcessAdapter, WorkerOptions
from market_pipeline.hardware.protocol import OutcomeStatus
from market_pipeline.warehouse import open_warehouse

TIMING = DrainTiming(
    warn_seconds=0.5,
    checkpoint_timeout_seconds=1.0,
    terminate_timeout_seconds=1.0,
    max_total_seconds=8.0,
    kill_timeout_seconds=3.0,
    verify_timeout_seconds=2.0,
    call_margin_seconds=2.0,
    poll_seconds=0.05,
)
SLACK = 2.5  # process start-up and polling on a busy 2-core machine


@pytest.fixture
def adapter(tmp_path):
    return LocalProcessAdapter(
        tmp_path / "registry.json",
        tmp_path / "tasks",
        node_id="box",
        pool_id="A10@z",
        gpu_model="A10",
        zone="z",
        gpu_slots=4,
        use_nvml=False,
    )


def drain(adapter, task, store=None, timing=TIMING, drain_id=None):
    store = store if store is not None else InMemoryAuditStore()
    executor = DrainExecutor(adapter, store, timing, grace_seconds=10)
    started = time.monotonic()
    report = executor.run(DrainRequest(drain_id=drain_id or f"d-{task.task_id}", task=task))
    return report, time.monotonic() - started


def record(adapter, task_id):
    return adapter.registry.read()["tasks"][task_id]


def test_drain_cooperative_worker_checkpoints_and_exits(adapter):
    task = adapter.launch_task(task_id="coop", options=WorkerOptions(util_pct=30))
    assert [t.task_id for t in adapter.list_tasks()] == ["coop"]
    assert adapter.verify_released(task.gpu_uuids).status is OutcomeStatus.FAILED
    report, seconds = drain(adapter, task)
    assert report.outcome == "terminated" and report.checkpoint == "ok"
    assert report.states == ("requested", "warned", "checkpointing", "terminating", "released", "reported")
    ckpt = json.loads((adapter.workdir / "coop" / "checkpoint.json").read_text())
    assert ckpt["step"] > 0
    assert record(adapter, "coop")["exit_code"] == 0
    assert adapter.list_tasks() == []
    assert adapter.verify_released(task.gpu_uuids).ok
    events = adapter.read_task_events(
        datetime(2000, 1, 1, tzinfo=timezone.utc), datetime.now(timezone.utc) + timedelta(seconds=1)
    )
    assert events["event"].to_list() == ["start", "drain_signal", "drained"]
    assert seconds < TIMING.checkpoint_timeout_seconds + TIMING.terminate_timeout_seconds + SLACK


def test_drain_slow_checkpoint_gets_its_sigterm_grace(adapter):
    task = adapter.launch_task(task_id="slow", options=WorkerOptions(checkpoint_seconds=1.5))
    timing = DrainTiming(
        warn_seconds=0.3,
        checkpoint_timeout_seconds=0.3,
        terminate_timeout_seconds=4.0,
        max_total_seconds=10.0,
        kill_timeout_seconds=3.0,
        verify_timeout_seconds=2.0,
        call_margin_seconds=2.0,
        poll_seconds=0.05,
    )
    report, _ = drain(adapter, task, timing=timing)
    # The checkpoint overran its wait, then finished inside the SIGTERM grace.
    assert report.checkpoint == "timeout" and report.outcome == "terminated"
    assert record(adapter, "slow")["exit_code"] == 0


def test_drain_worker_ignoring_sigterm_is_killed(adapter):
    task = adapter.launch_task(task_id="deaf", options=WorkerOptions(ignore_sigterm=True))
    report, seconds = drain(adapter, task)
    assert report.outcome == "killed"
    assert "killed" in report.states and report.states[-1] == "reported"
    assert record(adapter, "deaf")["exit_code"] == -signal.SIGKILL
    assert seconds < TIMING.checkpoint_timeout_seconds + TIMING.terminate_timeout_seconds + SLACK


def test_drain_worker_crashing_mid_drain_is_gone(adapter):
    task = adapter.launch_task(task_id="crash", options=WorkerOptions(crash_on="checkpoint"))
    report, _ = drain(adapter, task)
    assert report.outcome == "gone" and report.checkpoint == "gone"
    assert "terminating" not in report.states
    assert record(adapter, "crash")["exit_code"] == 70
    assert report.final_state.value == "reported"


def test_drain_task_already_gone(adapter):
    task = adapter.launch_task(task_id="ghost")
    adapter._children[task.pid].kill()
    adapter._children[task.pid].wait()
    report, _ = drain(adapter, task)
    assert report.outcome == "gone"
    assert report.states == ("requested", "warned", "released", "reported")


def test_drain_arbitrary_pid_gets_only_sigterm(adapter):
    proc = subprocess.Popen(["sleep", "60"])
    try:
        task = adapter.adopt_pid(proc.pid)
        assert not task.checkpointable and task.started_at <= datetime.now(timezone.utc)
        report, seconds = drain(adapter, task)
        assert report.outcome == "terminated" and report.checkpoint == "skipped"
        # SIGUSR1 would have killed `sleep` with -10: it only ever saw SIGTERM.
        assert proc.wait(timeout=5) == -signal.SIGTERM
        assert seconds < TIMING.warn_seconds + TIMING.terminate_timeout_seconds + SLACK
    finally:
        proc.kill()
        proc.wait()


def test_drain_arbitrary_pid_ignoring_sigterm_is_killed(adapter):
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        report, _ = drain(adapter, adapter.adopt_pid(proc.pid))
        assert report.outcome == "killed"
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_drain_adopted_worker_keeps_its_checkpoint_protocol(adapter, tmp_path):
    ckpt = tmp_path / "ext" / "ckpt.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "market_pipeline.workers.toy_trainer", "--checkpoint", str(ckpt)],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # wait until its handlers are installed
            from market_pipeline.hardware.local_process.processes import caught_signals

            if signal.SIGUSR2 in caught_signals(proc.pid):
                break
            time.sleep(0.02)
        task = adapter.adopt_pid(proc.pid)
        assert task.checkpointable
        report, _ = drain(adapter, task)
        assert report.outcome == "terminated" and report.checkpoint == "ok"
        assert proc.wait(timeout=5) == 0 and ckpt.exists()
    finally:
        proc.kill()
        proc.wait()


def test_drain_audit_and_billing_event_in_the_warehouse(adapter, tmp_path):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    task = adapter.launch_task(task_id="billed", tenant_id="acme")
    store = WarehouseAuditStore(warehouse)
    report, _ = drain(adapter, task, store=store, drain_id="dec-1")
    audit = warehouse.query("SELECT seq, state FROM drain_audit WHERE drain_id = 'dec-1' ORDER BY seq")
    assert audit["seq"].to_list() == list(range(audit.height))
    assert audit["state"][-1] == "reported"
    billing = warehouse.query("SELECT * FROM drain_billing_events").to_dicts()
    assert len(billing) == 1
    event = billing[0]
    assert (event["tenant_id"], event["outcome"], event["platform_fault"]) == ("acme", "terminated", False)
    assert event["grace_seconds"] == 10.0
    assert event["drain_signal_at"] == report.drain_signal_at
    assert event["task_ended_at"] >= event["drain_signal_at"]
    # Rerunning the finished drain writes nothing and signals nothing.
    assert drain(adapter, task, store=store, drain_id="dec-1")[0] == report
    assert warehouse.query("SELECT count(*) AS n FROM drain_audit")["n"][0] == audit.height


def test_drain_local_samples_report_the_worker_duty_cycle(adapter):
    task = adapter.launch_task(
        task_id="busy", gpu_milli=500, options=WorkerOptions(util_pct=40, metrics_seconds=0.2)
    )
    time.sleep(1.2)
    samples = adapter.read_samples(
        datetime.now(timezone.utc) - timedelta(minutes=1), datetime.now(timezone.utc) + timedelta(seconds=1)
    )
    drain(adapter, task)
    assert samples.height >= 2
    assert set(samples["task_id"]) == {"busy"}
    # Half a GPU at ~40% busy: whole-GPU SM utilisation well under 50%.
    assert 0 < samples["sm_util_pct"].mean() <= 50


def test_drain_launch_refuses_an_overfull_node(adapter):
    tasks = [adapter.launch_task(task_id=f"g{i}", gpus=2) for i in range(2)]
    try:
        with pytest.raises(ValueError, match="no room"):
            adapter.launch_task(task_id="extra")
    finally:
        for task in tasks:
            assert adapter.kill_task(task.task_id).ok
    assert adapter.power_off(adapter.node_id).status is OutcomeStatus.UNSUPPORTED
