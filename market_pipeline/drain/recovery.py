"""Recovery of drained work: a drained checkpointable task is requeued, on backends that can.

After a drain ends the task (terminated or killed), its work comes back where the backend can
requeue it (`requeue_task`: the slurm backend's `scontrol requeue`); the new run resumes from
the checkpoint the drain asked for and is metered as its own task (billing of the drained run
stopped at its warning plus the grace period). A task that is not requeued says why: drained
for its tenant's budget (the work must not come back), not checkpointable, or a backend that
cannot requeue.
"""

from __future__ import annotations

from collections.abc import Sequence

from market_pipeline.disruption.budget import DisruptionReason
from market_pipeline.hardware.protocol import Outcome, OutcomeStatus, TaskInfo

ENDED_BY_DRAIN = frozenset({"terminated", "killed"})


def requeue_drained(adapter: object, task: TaskInfo, reasons: Sequence[str]) -> Outcome:
    """Requeue one drained task, or the outcome saying why not (UNSUPPORTED)."""
    trigger = reasons[0].split(":", 1)[0].strip() if reasons else ""
    if trigger == DisruptionReason.BUDGET.value:
        return Outcome(OutcomeStatus.UNSUPPORTED, "not requeued: drained for its tenant's budget")
    if not task.checkpointable:
        return Outcome(OutcomeStatus.UNSUPPORTED, "not requeued: the task is not checkpointable")
    requeue = getattr(adapter, "requeue_task", None)
    if requeue is None:
        backend = getattr(adapter, "backend", type(adapter).__name__)
        return Outcome(OutcomeStatus.UNSUPPORTED, f"not requeued: backend {backend} cannot requeue")
    return requeue(task.task_id)
