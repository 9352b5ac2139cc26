"""Recovery of drained work on the twin: a drained checkpointable task is requeued as a new run
that does the rest of its work; its tenant's usage shows both runs, the drained one ending at
its drain with its warning (billing stops at warning + grace), the new one from its start."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.billing.metering import HourWindow, meter_window
from market_pipeline.config import load_config
from market_pipeline.drain.calls import InlineStepCaller, clock_for
from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.protocol import InMemoryAuditStore
from market_pipeline.drain.recovery import requeue_drained
from market_pipeline.drain.steps import DrainTiming
from market_pipeline.fleet.twin_adapter import SimulatedAdapter
from market_pipeline.hardware.protocol import OutcomeStatus, TaskInfo

EPOCH = datetime(2026, 1, 5, tzinfo=UTC)


@pytest.fixture
def adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedAdapter:
    monkeypatch.setattr(time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("wall sleep")))
    fleet = SimulatedAdapter(load_config(), tmp_path / "fleet.json", epoch=EPOCH)
    fleet.advance(EPOCH + timedelta(hours=1, minutes=17))  # drains inside an hour, not on its edge
    return fleet


def drain(adapter: SimulatedAdapter, task: TaskInfo) -> str:
    clock = clock_for(adapter)
    executor = DrainExecutor(
        adapter,
        InMemoryAuditStore(),
        DrainTiming.from_config(load_config()),
        clock=clock,
        caller=InlineStepCaller(clock),
    )
    report = executor.run(
        DrainRequest(drain_id=f"d-{task.task_id}", task=task, reasons=("scale_down: test",))
    )
    return report.outcome


def test_a_drained_checkpointable_task_runs_again_and_both_runs_are_metered(
    adapter: SimulatedAdapter, tmp_path: Path
) -> None:
    tasks = adapter.list_tasks()
    task = next(t for t in tasks if t.checkpointable and not t.do_not_drain and t.kind.value == "training")
    assert adapter.cordon(task.node_id).ok  # the scale-down: the node takes nothing new
    assert drain(adapter, task) == "terminated"
    assert task.task_id not in {t.task_id for t in adapter.list_tasks()}

    # the requeue survives the twin's reload: another process (a fresh adapter) carries it out
    again_adapter = SimulatedAdapter(load_config(), tmp_path / "fleet.json", epoch=EPOCH)
    outcome = requeue_drained(again_adapter, task, ("scale_down: scaler empties node",))
    assert outcome.ok and outcome.detail.startswith(f"requeued as {task.task_id}~r2"), outcome
    second = requeue_drained(again_adapter, task, ("scale_down: scaler empties node",))
    assert second.status is OutcomeStatus.UNSUPPORTED and "nothing to requeue" in second.detail

    rerun_id = f"{task.task_id}~r2"
    deadline = adapter.now() + timedelta(hours=6)
    while rerun_id not in {t.task_id for t in adapter.list_tasks()} and adapter.now() < deadline:
        adapter.advance(adapter.now() + timedelta(minutes=5))  # queued until room frees up
    [rerun] = [t for t in adapter.list_tasks() if t.task_id == rerun_id]
    assert rerun.tenant_id == task.tenant_id and rerun.node_id != task.node_id  # its node is cordoned

    end = adapter.now() + timedelta(seconds=1)
    events = adapter.read_task_events(EPOCH, end).filter(pl.col("task_id").is_in([task.task_id, rerun_id]))
    runs = {
        tid: frame["event"].to_list() for (tid,), frame in events.group_by("task_id", maintain_order=True)
    }
    assert runs[task.task_id][-2:] == ["drain_signal", "drained"] and runs[rerun_id] == ["start"]

    catalog = adapter.task_catalog([task.task_id, rerun_id])
    pools = {t.pool_id: tuple(t.pool_id.split("@")) for t in catalog}
    hour = rerun.started_at.replace(minute=0, second=0, microsecond=0)
    intervals = pl.concat(
        meter_window(events, catalog, HourWindow(start, start + timedelta(hours=1)), pools)
        for start in {EPOCH + timedelta(hours=h) for h in range(int((hour - EPOCH) / timedelta(hours=1)) + 1)}
    )
    drained = intervals.filter(pl.col("task_id") == task.task_id).sort("ended_at")
    resumed = intervals.filter(pl.col("task_id") == rerun_id)
    last = drained.row(-1, named=True)  # earlier hours of the run end "running" at the hour's end
    signal = events.filter((pl.col("task_id") == task.task_id) & (pl.col("event") == "drain_signal"))["ts"][0]
    assert last["end_reason"] == "drained"
    # billed up to its end, no later than warning + grace (the twin's checkpoint takes no fleet
    # time, so the run ends in the warning's second and rating has no grace left to add)
    grace = timedelta(seconds=load_config().billing.grace_seconds)
    assert signal <= last["ended_at"] <= signal + grace
    assert resumed.height >= 1 and resumed["drain_signal_at"].null_count() == resumed.height
    assert set(intervals["tenant_id"]) == {task.tenant_id}
    # billing restarts only when the task runs again: the runs do not overlap
    assert drained["ended_at"].max() <= resumed["started_at"].min()


def test_a_task_that_cannot_be_requeued_says_why(adapter: SimulatedAdapter) -> None:
    tasks = adapter.list_tasks()
    rigid = next(t for t in tasks if not t.checkpointable and not t.do_not_drain)
    assert drain(adapter, rigid) == "terminated"
    refused = requeue_drained(adapter, rigid, ("scale_down: test",))
    assert refused.status is OutcomeStatus.UNSUPPORTED and "not checkpointable" in refused.detail
    assert adapter.requeue_task(rigid.task_id).status is OutcomeStatus.UNSUPPORTED

    running = next(t for t in adapter.list_tasks() if t.checkpointable)
    still = adapter.requeue_task(running.task_id)
    assert still.status is OutcomeStatus.FAILED and "drain it first" in still.detail
    budget = requeue_drained(adapter, running, ("budget: tenant over its budget",))
    assert budget.status is OutcomeStatus.UNSUPPORTED and "tenant's budget" in budget.detail
