"""How a drain step and a whole drain end: whose fault a step's result is (recorded for SLA
credits), and the terminal row's detail with the billing record the metering reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from market_pipeline.drain.calls import StepResult
from market_pipeline.drain.protocol import (
    STATUS_INTERRUPTED,
    STATUS_SKIPPED,
    DrainState,
    DrainTransition,
)
from market_pipeline.drain.steps import Step, summarize
from market_pipeline.hardware.protocol import OutcomeStatus, TaskInfo


def task_fault(step: Step, result: StepResult) -> bool:
    """Whether a step's result is the platform's fault (recorded for SLA credits)."""
    if result.platform_fault:
        return True
    if result.status in (
        OutcomeStatus.OK.value,
        OutcomeStatus.GONE.value,
        OutcomeStatus.UNSUPPORTED.value,
        STATUS_SKIPPED,
        STATUS_INTERRUPTED,
    ):
        return False
    # A checkpoint or SIGTERM answered too late is the task's doing; anything else is ours.
    if step in (Step.CHECKPOINT, Step.TERMINATE) and result.status == OutcomeStatus.TIMEOUT.value:
        return False
    return True


def terminal_detail(
    history: list[DrainTransition],
    task: TaskInfo,
    state: DrainState,
    reason: str,
    platform_fault: bool,
    now: datetime,
) -> dict[str, Any]:
    """The detail of a drain's terminal row: its outcome, whose fault, and the billing record."""
    summary = summarize(history)
    outcome = {DrainState.FAILED: "failed", DrainState.ABORTED: "aborted"}.get(state, summary.outcome)
    fault = platform_fault or summary.platform_fault
    billing = {
        "drain_id": summary.drain_id,
        "decision_id": summary.decision_id,
        "task_id": task.task_id,
        "tenant_id": task.tenant_id,
        "pool_id": task.pool_id,
        "node_id": task.node_id,
        "drain_signal_at": summary.drain_signal_at.isoformat() if summary.drain_signal_at else None,
        "grace_seconds": float(history[0].detail.get("grace_seconds", 0.0)),
        "task_ended_at": summary.task_ended_at.isoformat() if summary.task_ended_at else None,
        "outcome": outcome,
        "platform_fault": fault,
        "reason": reason,
        "recorded_at": now.isoformat(),
    }
    return {
        "phase": "only",
        "reason": reason,
        "outcome": outcome,
        "platform_fault": fault,
        "billing": billing,
    }
