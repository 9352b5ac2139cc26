"""Issue 23's drain findings, each as a test: process trees, resumed notice, one drain per
task, protected pids, durations and missing pids refused before anything is written."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from drain_targets import cli, fork_cli, start_target

from market_pipeline.drain.steps import DrainTiming

W, T = 1.0, 1.0


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    return tmp_path


def drain_argv(pid: int, *extra: str, warn: float = W, grace: float = T) -> list[str]:
    return [
        "drain",
        "--backend",
        "local-process",
        "--pid",
        str(pid),
        "--warn-seconds",
        str(warn),
        "--timeout-seconds",
        str(grace),
        "--json",
        *extra,
    ]


def nothing_written(home) -> bool:
    return not (home / "var" / "warehouse.duckdb").exists() and not list(home.rglob("*.journal.json"))


@pytest.mark.parametrize(
    "flags",
    [("--setsid", "--children", "5", "--orphans", "2"), ("--children", "3", "--deaf-children")],
    ids=["own-session-with-orphans", "in-our-group-children-ignore-term"],
)
def test_drain_reaches_every_process_of_a_forked_task(home, tmp_path, capsys, flags):
    target = start_target(tmp_path, *flags)
    try:
        rc = cli(drain_argv(target.pids[0], "--audit", "memory", warn=0.3, grace=0.8))
        result = json.loads(capsys.readouterr().out)
        assert rc == 0 and result["final_state"] == "reported", result
        # Released only once every process of the tree is gone: none is left behind.
        assert target.left() == []
        expected = "killed" if "--deaf-children" in flags else "terminated"
        assert result["outcome"] == expected
        received = target.signals()
        # Each process got SIGTERM exactly once (the root its SIGUSR1 warning once, too).
        assert all(received[(pid, "SIGTERM")] == 1 for pid in target.pids), received
        assert received[(target.pids[0], "SIGUSR1")] == 1
        assert max(received.values()) == 1
    finally:
        target.cleanup()


@pytest.mark.parametrize("audit", ["warehouse", "memory"])
def test_drain_resumed_after_kill_9_still_gives_the_full_notice(home, tmp_path, audit):
    target = start_target(tmp_path)
    warn = 2.5
    argv = drain_argv(target.pids[0], "--audit", audit, warn=warn, grace=2.0)
    try:
        first = fork_cli(argv, tmp_path / "first.out")
        deadline = time.monotonic() + 30
        while not target.signals() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)  # the drain command dies inside the notice
        first.join()
        rerun = fork_cli(argv, tmp_path / "rerun.out")
        rerun.join(timeout=60)
        result = json.loads((tmp_path / "rerun.out").read_text().strip().splitlines()[-1])
        assert rerun.exitcode == 0 and result["outcome"] == "terminated", result
        notice = target.first("SIGTERM") - target.first("SIGUSR1")
        assert notice >= warn - 0.05, f"SIGTERM {notice:.2f}s after the warning"
        received = target.signals()
        assert received[(target.pids[0], "SIGUSR1")] == 1  # the warning was not repeated
        assert received[(target.pids[0], "SIGTERM")] == 1
        assert target.left() == []
    finally:
        target.cleanup()


@pytest.mark.parametrize("audit", ["memory", "warehouse"])
def test_two_concurrent_drains_of_one_task_signal_it_once(home, tmp_path, audit):
    target = start_target(tmp_path)
    argv = drain_argv(target.pids[0], "--audit", audit)
    try:
        runs = [fork_cli(argv, tmp_path / f"run{i}.out") for i in range(2)]
        for run in runs:
            run.join(timeout=60)
        codes = sorted(run.exitcode for run in runs)
        outputs = [(tmp_path / f"run{i}.out").read_text() for i in range(2)]
        assert codes == [0, 2], outputs
        busy = next(o for o, run in zip(outputs, runs) if run.exitcode == 2)
        assert "is being drained by another run" in busy and "Traceback" not in busy
        received = target.signals()
        assert received[(target.pids[0], "SIGUSR1")] == 1
        assert received[(target.pids[0], "SIGTERM")] == 1
    finally:
        target.cleanup()


def test_drain_refuses_pid_1_itself_and_its_ancestors(home, capsys):
    import psutil

    ancestors = [p.pid for p in psutil.Process().parents()]
    for pid in {1, os.getpid(), os.getppid(), *ancestors}:
        rc = cli(drain_argv(pid))
        captured = capsys.readouterr()
        assert rc == 2 and captured.out == "", pid
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
        assert "refusing to drain it" in captured.err
    assert nothing_written(home)


@pytest.mark.parametrize("flag", ["--warn-seconds", "--timeout-seconds", "--checkpoint-timeout-seconds"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e400", "abc", ""])
def test_drain_refuses_a_bad_duration_before_any_row(home, tmp_path, capsys, flag, value):
    target = start_target(tmp_path)
    try:
        argv = ["drain", "--backend", "local-process", "--pid", str(target.pids[0]), f"{flag}={value}"]
        rc = cli(argv)
        captured = capsys.readouterr()
        assert rc == 2 and captured.out == ""
        assert captured.err.startswith(f"error: {flag} must be a finite number of seconds")
        assert nothing_written(home) and not target.signals()
    finally:
        target.cleanup()


def test_drain_timing_itself_refuses_non_finite_waits():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            DrainTiming(
                warn_seconds=bad,
                checkpoint_timeout_seconds=1,
                terminate_timeout_seconds=1,
                max_total_seconds=10,
            )
        with pytest.raises(ValueError, match="finite"):
            DrainTiming(
                warn_seconds=1,
                checkpoint_timeout_seconds=1,
                terminate_timeout_seconds=1,
                max_total_seconds=bad,
            )


def test_a_drain_whose_task_lease_is_held_writes_nothing_and_sends_nothing(tmp_path):
    """The Dagster job and the CLI share the lease directory: whichever comes second for
    the same task is refused before its first row, whatever its audit store."""
    from drain_testkit import T0, FakeClock, FakeFleetAdapter, make_task, node

    from market_pipeline.drain.executor import DrainExecutor, DrainRequest
    from market_pipeline.drain.lease import DrainBusy, TaskLease
    from market_pipeline.drain.protocol import InMemoryAuditStore

    clock = FakeClock(T0)
    task = make_task("t-1")
    fleet = FakeFleetAdapter(clock, [(task, "cooperative")], [node("n1")])
    timing = DrainTiming(
        warn_seconds=1, checkpoint_timeout_seconds=1, terminate_timeout_seconds=1, max_total_seconds=10
    )
    store = InMemoryAuditStore()
    executor = DrainExecutor(fleet, store, timing, clock=clock, lease_dir=tmp_path)
    with TaskLease(tmp_path, "t-1"):
        with pytest.raises(DrainBusy, match="t-1 is being drained by another run"):
            executor.run(DrainRequest(drain_id="d-1", task=task))
    assert store.drain_ids() == [] and sum(fleet.delivered.values()) == 0
    report = executor.run(DrainRequest(drain_id="d-1", task=task))  # lease free again
    assert report.outcome == "terminated"
    assert all(n == 1 for n in fleet.delivered.values())
    assert not list(tmp_path.glob("*.journal.json"))  # finished: nothing left to resume


def test_a_recycled_pid_is_not_part_of_the_task(tmp_path):
    """The registry pins a task's processes by create time: a live process under the same
    pid but another create time (the task's pid, reused) is never signalled."""
    from market_pipeline.hardware.local_process.adapter import LocalProcessAdapter
    from market_pipeline.hardware.process_tree import task_tree
    from market_pipeline.hardware.protocol import OutcomeStatus

    target = start_target(tmp_path)
    try:
        pid = target.pids[0]
        assert task_tree(pid, target.created[pid] - 30).members == ()
        adapter = LocalProcessAdapter(
            tmp_path / "registry.json",
            tmp_path / "tasks",
            node_id="box",
            pool_id="A10@z",
            gpu_model="A10",
            zone="z",
            gpu_slots=1,
            use_nvml=False,
        )
        task = adapter.adopt_pid(pid)
        with adapter.registry.edit() as reg:  # as if the adopted process had died long ago
            reg["tasks"][task.task_id]["create_time"] -= 30
        assert adapter.terminate_task(task.task_id, 1).status is OutcomeStatus.GONE
        assert target.left() == [pid] and not target.signals()
    finally:
        target.cleanup()


def test_adopting_a_launched_worker_keeps_its_task(tmp_path):
    """`drain --pid` of a worker the platform launched drains that task (same id, same
    lease), not a second task over the same process."""
    from market_pipeline.hardware.local_process.adapter import LocalProcessAdapter, WorkerOptions

    adapter = LocalProcessAdapter(
        tmp_path / "registry.json",
        tmp_path / "tasks",
        node_id="box",
        pool_id="A10@z",
        gpu_model="A10",
        zone="z",
        gpu_slots=1,
        use_nvml=False,
    )
    task = adapter.launch_task(task_id="w", options=WorkerOptions(util_pct=5))
    try:
        assert adapter.adopt_pid(task.pid).task_id == "w"
        assert [t.task_id for t in adapter.list_tasks()] == ["w"]
    finally:
        adapter.kill_task("w")
