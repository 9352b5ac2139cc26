"""Recovery of drained work: who is requeued, and why a task is not."""

from __future__ import annotations

from datetime import datetime, timezone

from market_pipeline.drain.recovery import requeue_drained
from market_pipeline.hardware.protocol import Outcome, OutcomeStatus, ResourceClass, TaskInfo, TaskKind


def _task(checkpointable: bool = True) -> TaskInfo:
    return TaskInfo(
        task_id="42@1796411686",
        tenant_id="acme-research",
        pool_id="H800@cn-beijing-b",
        node_id="node3",
        gpu_uuids=("node3/gpu0",),
        gpu_milli=1000,
        kind=TaskKind.TRAINING,
        qos="BE",
        priority=0,
        resource_class=ResourceClass.DRAINABLE,
        started_at=datetime(2026, 12, 4, tzinfo=timezone.utc),
        checkpointable=checkpointable,
    )


class _Requeuing:
    backend = "requeuing"

    def __init__(self) -> None:
        self.requeued: list[str] = []

    def requeue_task(self, task_id: str) -> Outcome:
        self.requeued.append(task_id)
        return Outcome.success(f"job {task_id} requeued")


class _NoRequeue:
    backend = "simulated"


def test_a_drained_checkpointable_task_is_requeued() -> None:
    adapter = _Requeuing()
    outcome = requeue_drained(adapter, _task(), ("scale_down: node empty for the scaler", "score: 1.00"))
    assert outcome.ok and adapter.requeued == ["42@1796411686"]


def test_a_task_that_is_not_requeued_says_why() -> None:
    adapter = _Requeuing()
    budget = requeue_drained(adapter, _task(), ("budget: balance exhausted",))
    rigid = requeue_drained(adapter, _task(checkpointable=False), ("scale_down: x",))
    twin = requeue_drained(_NoRequeue(), _task(), ("scale_down: x",))
    assert adapter.requeued == []
    assert {o.status for o in (budget, rigid, twin)} == {OutcomeStatus.UNSUPPORTED}
    assert "budget" in budget.detail and "not checkpointable" in rigid.detail
    assert twin.detail == "not requeued: backend simulated cannot requeue"
