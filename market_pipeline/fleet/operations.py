"""Interventions on the twin, applied at its clock, each returning a typed Outcome.

Task exits are recorded at the clock: the simulated seconds an exit or a checkpoint takes
are reported in `Outcome.seconds`, not waited for. A SIGTERM the task does not honour in
time leaves it running (TIMEOUT); it exits later on its own unless killed. Killing or
terminating a task without a prior drain signal is recorded as a platform-caused failure
(kill) or a drain without warning (terminate).
"""

from __future__ import annotations

from collections.abc import Sequence

from market_pipeline.fleet.twin import FleetTwin, RunningTask
from market_pipeline.hardware.protocol import NodeState, Outcome, OutcomeStatus


def _task(twin: FleetTwin, task_id: str) -> RunningTask | Outcome:
    task = twin.running.get(task_id)
    if task is not None:
        return task
    if any(job.task_id == task_id for job in twin.pending):
        return Outcome(OutcomeStatus.GONE, f"task {task_id} has not started (pending)")
    return Outcome(OutcomeStatus.GONE, f"task {task_id} is not running")


def warn(twin: FleetTwin, task_id: str, deadline_seconds: float) -> Outcome:
    task = _task(twin, task_id)
    if isinstance(task, Outcome):
        return task
    if task.drain_signal_ts is not None:
        return Outcome.success(f"already warned at {task.drain_signal_ts}")
    twin.signal_drain(task)
    twin.new_events.append(
        (twin.clock, task_id, "drain_signal", f"drain within {deadline_seconds:g}s", False)
    )
    return Outcome.success(f"drain signal sent, deadline {deadline_seconds:g}s")


def checkpoint(twin: FleetTwin, task_id: str, timeout_seconds: float) -> Outcome:
    task = _task(twin, task_id)
    if isinstance(task, Outcome):
        return task
    if not task.job.checkpointable:
        return Outcome(OutcomeStatus.UNSUPPORTED, f"task {task_id} declares no checkpoint hook")
    if task.job.checkpoint_s > timeout_seconds:
        return Outcome(
            OutcomeStatus.TIMEOUT,
            f"checkpoint needs {task.job.checkpoint_s:.1f}s > {timeout_seconds:g}s",
            timeout_seconds,
        )
    task.checkpoint_ts = twin.clock
    return Outcome.success(f"checkpoint saved in {task.job.checkpoint_s:.1f}s", task.job.checkpoint_s)


def terminate(twin: FleetTwin, task_id: str, timeout_seconds: float) -> Outcome:
    task = _task(twin, task_id)
    if isinstance(task, Outcome):
        return task
    job = task.job
    first_sigterm = task.sigterm_ts is None
    if first_sigterm:
        task.sigterm_ts = twin.clock
    if job.ignores_sigterm:
        return Outcome(
            OutcomeStatus.TIMEOUT, f"task {task_id} ignored SIGTERM for {timeout_seconds:g}s", timeout_seconds
        )
    if job.exit_s <= timeout_seconds:
        reason = "terminated" if task.drain_signal_ts is not None else "terminated without drain signal"
        twin.finish(task_id, twin.clock, "drained", reason)
        twin.schedule_pending(twin.clock, [task.placement.node])
        return Outcome.success(f"exited {job.exit_s:.1f}s after SIGTERM", job.exit_s)
    if first_sigterm:  # it will exit on its own, later
        exit_ts = twin.clock + int(-(-job.exit_s // 1))
        if exit_ts < task.end_ts:
            task.end_ts = exit_ts
            twin.push(exit_ts, "end", task_id, task_id)
    return Outcome(
        OutcomeStatus.TIMEOUT,
        f"task {task_id} still running {timeout_seconds:g}s after SIGTERM",
        timeout_seconds,
    )


def kill(twin: FleetTwin, task_id: str) -> Outcome:
    task = _task(twin, task_id)
    if isinstance(task, Outcome):
        return task
    if task.drain_signal_ts is not None or task.sigterm_ts is not None:
        twin.finish(task_id, twin.clock, "drained", "killed after drain signal")
    else:
        twin.finish(task_id, twin.clock, "failed", "killed without drain signal", platform_fault=True)
    twin.schedule_pending(twin.clock, [task.placement.node])
    return Outcome.success("SIGKILL delivered")


def verify_released(twin: FleetTwin, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
    unknown = [u for u in gpu_uuids if u not in twin.catalog.gpu_position]
    if unknown:
        return Outcome(OutcomeStatus.GONE, f"unknown GPUs {unknown[:3]}")
    held = {}
    for uuid in gpu_uuids:
        holders = sorted(
            h for h in twin.load.holders[twin.catalog.gpu_position[uuid]] if task_id is None or h == task_id
        )
        if holders:
            held[uuid] = holders
    if held:
        detail = "; ".join(f"{u} held by {', '.join(t)}" for u, t in sorted(held.items()))
        return Outcome(OutcomeStatus.FAILED, detail)
    return Outcome.success(f"{len(gpu_uuids)} GPUs free")


def _node(twin: FleetTwin, node_id: str) -> int | Outcome:
    row = twin.catalog.node_row(node_id)
    if row is None:
        return Outcome(OutcomeStatus.GONE, f"node {node_id} is not in the fleet")
    return row


def set_cordon(twin: FleetTwin, node_id: str, cordoned: bool) -> Outcome:
    row = _node(twin, node_id)
    if isinstance(row, Outcome):
        return row
    if bool(twin.cordoned[row]) == cordoned:
        return Outcome.success(f"node {node_id} already {'cordoned' if cordoned else 'schedulable'}")
    twin.set_cordoned(row, cordoned)
    if not cordoned:
        twin.schedule_pending(twin.clock, [row])
    return Outcome.success(f"node {node_id} {'cordoned' if cordoned else 'uncordoned'}")


def power_on(twin: FleetTwin, node_id: str) -> Outcome:
    row = _node(twin, node_id)
    if isinstance(row, Outcome):
        return row
    state = twin.node_state[row]
    if state is NodeState.ON:
        return Outcome.success(f"node {node_id} is already on")
    if row in twin.joining:
        return Outcome.success(f"node {node_id} joins at {twin.joining[row]}")
    delay = twin.params.warm_join_s if state is NodeState.WARM else twin.params.provision_s
    twin.schedule_join(row, twin.clock + delay)
    return Outcome.success(f"node {node_id} joins in {delay}s", float(delay))


def power_off(twin: FleetTwin, node_id: str) -> Outcome:
    row = _node(twin, node_id)
    if isinstance(row, Outcome):
        return row
    tasks = sum(1 for t in twin.running.values() if t.placement.node == row)
    if tasks:
        return Outcome(OutcomeStatus.FAILED, f"node {node_id} still runs {tasks} tasks; drain it first")
    twin.joining.pop(row, None)
    if twin.node_state[row] is NodeState.OFF:
        return Outcome.success(f"node {node_id} is already off")
    twin.set_node_state(row, NodeState.OFF)
    return Outcome.success(f"node {node_id} powered off")


def requeue(twin: FleetTwin, task_id: str) -> Outcome:
    """A drained checkpointable task runs again as a new run, for the rest of its work from its
    last checkpoint; a task that cannot be requeued says why."""
    if task_id in twin.running:
        return Outcome(OutcomeStatus.FAILED, f"task {task_id} still runs: drain it first")
    if task_id not in twin.requeueable:
        return Outcome(
            OutcomeStatus.UNSUPPORTED,
            f"task {task_id} has nothing to requeue (not drained, not checkpointable, or requeued already)",
        )
    job = twin.requeue(task_id)
    where = "running" if job.task_id in twin.running else "queued"
    return Outcome.success(f"requeued as {job.task_id} ({where}, {job.lifetime_s}s of work left)")
