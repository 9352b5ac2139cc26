"""A tick's batch of approved drain decisions, each carried out once through the drain
protocol (`drain.service.execute_decision`, which records the drain's own outcome on
the decision: terminated, killed, gone, failed or aborted). A drained checkpointable task is
then requeued where the backend can (`drain.recovery`); the batch result says whether."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from market_pipeline.action_batches import (
    ActionBatch,
    ActionResult,
    batch_id_for,
    batch_rows,
    carry_out,
    pending_batches,
    record_outcome,
    result_for,
)
from market_pipeline.drain.recovery import ENDED_BY_DRAIN, requeue_drained
from market_pipeline.drain.service import DrainRefused, execute_decision
from market_pipeline.drain.store import DecisionNotFound, load_decision
from market_pipeline.hardware.protocol import NodeAdapter
from market_pipeline.warehouse import Warehouse
from market_pipeline.warehouse.decisions import DecisionKind, DecisionOutcome

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

DRAIN_KIND = DecisionKind.DRAIN
# The drain report's outcome -> the batch's status (a task already gone needed no drain).
_STATUS = {
    "terminated": DecisionOutcome.OK,
    "killed": DecisionOutcome.OK,
    "gone": DecisionOutcome.OK,
    "aborted": DecisionOutcome.ABORTED,
    "failed": DecisionOutcome.FAILED,
}


def pending_drain_batches(store: Warehouse) -> list[ActionBatch]:
    """Ticks with approved, live drains not yet finished (what the drain sensor launches)."""
    return pending_batches(store, DRAIN_KIND)


def execute_drain_batch(
    store: Warehouse,
    adapter: NodeAdapter,
    config: MarketPipelineConfig,
    tick: datetime,
    *,
    run_id: str,
    now: datetime,
    run_is_live: Callable[[str], bool],
) -> list[ActionResult]:
    """Run (or resume) every approved drain of the tick, each once.

    A drain whose run died half-way is taken over and resumed from its audit log. Each
    drain's outcome is written by the drain protocol as it ends (a drain stopped half-way
    keeps none, so that a resume run continues it).
    """

    def act(row: dict[str, Any]) -> ActionResult:
        try:
            report = execute_decision(store, adapter, config, row["decision_id"])
        except (DrainRefused, DecisionNotFound) as exc:
            result = result_for(row, DecisionOutcome.INFEASIBLE, str(exc))
            record_outcome(store, row["decision_id"], now, result.outcome)
            return result
        detail = f"{report.outcome}: {report.reason}" if report.reason else report.outcome
        if report.outcome in ENDED_BY_DRAIN:
            decision = load_decision(store, row["decision_id"])
            recovery = requeue_drained(adapter, decision.task, decision.reasons)
            detail += f"; requeue {recovery.status.value}: {recovery.detail}"
        return result_for(
            row,
            _STATUS.get(report.outcome, DecisionOutcome.RUNNING)
            if report.terminal
            else DecisionOutcome.RUNNING,
            detail,
        )

    return carry_out(
        store,
        batch_rows(store, DRAIN_KIND, tick),
        batch_id=batch_id_for(DRAIN_KIND, tick),
        run_id=run_id,
        now=now,
        run_is_live=run_is_live,
        resumable=True,
        act=act,
        record=False,
    )
