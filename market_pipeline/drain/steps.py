"""Pure rules of the drain protocol: timing, what to do next, and the drain's report.

Everything here reads an audit history and returns a value; the executor does the I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from market_pipeline.drain.protocol import (
    STATUS_INTERRUPTED,
    TERMINAL_STATES,
    DrainProtocolError,
    DrainState,
    DrainTransition,
    Phase,
)
from market_pipeline.hardware.protocol import OutcomeStatus

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

GONE = OutcomeStatus.GONE.value
LEGACY_TIMING_KEYS = frozenset({"verify_attempts", "verify_retry_seconds"})
OK = OutcomeStatus.OK.value


@dataclass(frozen=True)
class DrainTiming:
    """Every wait of a drain; persisted with the drain so a resumed run keeps its deadlines."""

    warn_seconds: float  # notice given to a task that cannot checkpoint on request
    checkpoint_timeout_seconds: float  # wait for the checkpoint hook's acknowledgement
    terminate_timeout_seconds: float  # SIGTERM -> SIGKILL grace
    max_total_seconds: float  # hard bound: past it, the task is killed at once
    kill_timeout_seconds: float = 5.0
    verify_timeout_seconds: float = 5.0  # one release check may take this long
    # After the task is gone, its GPUs are checked until released or this deadline passes
    # (a driver keeps listing an exited process for seconds), with growing pauses between.
    release_timeout_seconds: float = 20.0
    release_backoff_initial_seconds: float = 0.1
    release_backoff_max_seconds: float = 2.0
    call_margin_seconds: float = 5.0  # an adapter call may take its wait plus this, no more
    poll_seconds: float = 0.2

    def __post_init__(self) -> None:
        for name in (
            "warn_seconds",
            "checkpoint_timeout_seconds",
            "terminate_timeout_seconds",
            "kill_timeout_seconds",
            "verify_timeout_seconds",
            "release_timeout_seconds",
            "release_backoff_initial_seconds",
            "release_backoff_max_seconds",
            "call_margin_seconds",
            "max_total_seconds",
            "poll_seconds",
        ):
            value = getattr(self, name)
            # NaN passes every comparison and inf never elapses: both would skip the notice.
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"DrainTiming.{name} must be a finite number >= 0, got {value!r}")
        if self.max_total_seconds <= 0:
            raise ValueError(f"DrainTiming.max_total_seconds must be > 0, got {self.max_total_seconds}")
        if self.release_backoff_initial_seconds <= 0:
            raise ValueError("DrainTiming.release_backoff_initial_seconds must be > 0")
        if self.release_backoff_max_seconds < self.release_backoff_initial_seconds:
            raise ValueError(
                "DrainTiming.release_backoff_max_seconds must be >= release_backoff_initial_seconds"
            )
        if self.poll_seconds <= 0:
            raise ValueError("DrainTiming.poll_seconds must be > 0")

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "DrainTiming":
        """From a MarketPipelineConfig ([guardrails.task_drain] and the adapter timeout)."""
        section = config.guardrails.task_drain
        op_timeout = float(config.adapter.operation_timeout_seconds)
        return cls(
            warn_seconds=section.warn_seconds,
            checkpoint_timeout_seconds=section.checkpoint_timeout_seconds,
            terminate_timeout_seconds=section.terminate_timeout_seconds,
            max_total_seconds=section.max_total_seconds,
            kill_timeout_seconds=op_timeout,
            verify_timeout_seconds=op_timeout,
            release_timeout_seconds=section.release_timeout_seconds,
            release_backoff_initial_seconds=section.release_backoff_initial_seconds,
            release_backoff_max_seconds=section.release_backoff_max_seconds,
            call_margin_seconds=op_timeout,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DrainTiming":
        # Drains persisted before the release deadline counted attempts instead: those
        # keys are dropped and the deadline's defaults apply.
        data = {k: v for k, v in data.items() if k not in LEGACY_TIMING_KEYS}
        try:
            return cls(**data)
        except TypeError as exc:
            raise DrainProtocolError(f"persisted drain timing is malformed: {exc}") from exc


class Step(str, enum.Enum):
    CLOSE_INTERRUPTED = "close_interrupted"
    WARN = "warn"
    CHECKPOINT = "checkpoint"
    TERMINATE = "terminate"
    KILL = "kill"
    VERIFY = "verify"
    REPORT = "report"
    FAIL = "fail"
    DONE = "done"


@dataclass(frozen=True)
class NextStep:
    step: Step
    why: str = ""


def requested_at(history: Sequence[DrainTransition]) -> datetime:
    if not history or history[0].state is not DrainState.REQUESTED:
        raise DrainProtocolError("a drain history must start with its requested row")
    return history[0].recorded_at


def elapsed_seconds(history: Sequence[DrainTransition], now: datetime) -> float:
    return (now - requested_at(history)).total_seconds()


def remaining_seconds(history: Sequence[DrainTransition], now: datetime, timing: DrainTiming) -> float:
    return timing.max_total_seconds - elapsed_seconds(history, now)


def next_step(history: Sequence[DrainTransition], now: datetime, timing: DrainTiming) -> NextStep:
    """The protocol's next move after `history` (non-empty, ordered by seq)."""
    last = history[-1]
    if last.state in TERMINAL_STATES:
        return NextStep(Step.DONE)
    if last.phase is Phase.BEGIN:
        return NextStep(Step.CLOSE_INTERRUPTED, f"{last.state.value} was interrupted")
    over = remaining_seconds(history, now, timing) <= 0
    status = last.status
    state = last.state
    if state is DrainState.REQUESTED:
        return NextStep(Step.KILL, "max_total_seconds exceeded") if over else NextStep(Step.WARN)
    if state is DrainState.RELEASED:
        return NextStep(Step.REPORT)
    if state in (DrainState.WARNED, DrainState.CHECKPOINTING) and status == GONE:
        return NextStep(Step.VERIFY, "task gone before termination")
    if state is DrainState.WARNED:
        return NextStep(Step.KILL, "max_total_seconds exceeded") if over else NextStep(Step.CHECKPOINT)
    if state is DrainState.CHECKPOINTING:
        return NextStep(Step.KILL, "max_total_seconds exceeded") if over else NextStep(Step.TERMINATE)
    if state is DrainState.TERMINATING:
        if status in (OK, GONE):
            return NextStep(Step.VERIFY)
        if status == STATUS_INTERRUPTED and not last.detail.get("alive_after", True):
            return NextStep(Step.VERIFY, "task exited after an interrupted SIGTERM")
        return NextStep(Step.KILL, f"SIGTERM ended {status}")
    if state is DrainState.KILLED:
        if status in (OK, GONE):
            return NextStep(Step.VERIFY)
        if status == STATUS_INTERRUPTED:
            if last.detail.get("alive_after"):
                return NextStep(Step.KILL, "interrupted kill was not delivered")
            return NextStep(Step.VERIFY, "task gone after an interrupted kill")
        return NextStep(Step.FAIL, f"kill_failed: SIGKILL ended {status}: {last.detail.get('detail', '')}")
    raise DrainProtocolError(f"drain {last.drain_id}: no rule after {state.value}/{last.phase.value}")


# -- the drain's report ---------------------------------------------------------------------


@dataclass(frozen=True)
class DrainReport:
    drain_id: str
    task_id: str | None
    tenant_id: str | None
    final_state: DrainState
    outcome: str  # terminated | killed | gone | failed | aborted | running
    reason: str
    seconds: float
    states: tuple[str, ...]
    drain_signal_at: datetime | None
    task_ended_at: datetime | None
    checkpoint: str | None  # the checkpoint step's status, None if never reached
    platform_fault: bool
    decision_id: str | None

    @property
    def terminal(self) -> bool:
        return self.final_state in TERMINAL_STATES

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
            "states": list(self.states),
            "drain_id": self.drain_id,
            "task_id": self.task_id,
            "tenant_id": self.tenant_id,
            "final_state": self.final_state.value,
            "reason": self.reason,
            "checkpoint": self.checkpoint,
            "platform_fault": self.platform_fault,
            "decision_id": self.decision_id,
            "drain_signal_at": self.drain_signal_at.isoformat() if self.drain_signal_at else None,
            "task_ended_at": self.task_ended_at.isoformat() if self.task_ended_at else None,
        }


def _end_rows(history: Sequence[DrainTransition], state: DrainState) -> list[DrainTransition]:
    return [row for row in history if row.state is state and row.phase is Phase.END]


def task_outcome(history: Sequence[DrainTransition]) -> tuple[str, datetime | None]:
    """How the task ended (terminated | killed | gone | running) and when that was seen."""
    for row in history:
        if row.phase is not Phase.END:
            continue
        if row.state in (DrainState.WARNED, DrainState.CHECKPOINTING) and row.status == GONE:
            return "gone", row.recorded_at
        if row.state is DrainState.TERMINATING:
            if row.status == OK:
                return "terminated", row.recorded_at
            if row.status == GONE:
                return "gone", row.recorded_at
            if row.status == STATUS_INTERRUPTED and row.detail.get("alive_after") is False:
                return "terminated", row.recorded_at
        if row.state is DrainState.KILLED:
            if row.status == OK:
                return "killed", row.recorded_at
            if row.status == GONE:
                return "terminated", row.recorded_at  # exited just before the kill
            if row.status == STATUS_INTERRUPTED and row.detail.get("alive_after") is False:
                return "killed", row.recorded_at
    return "running", None


def summarize(history: Sequence[DrainTransition]) -> DrainReport:
    """The report of a drain from its audit rows (terminal or not)."""
    if not history:
        raise DrainProtocolError("cannot summarise a drain without audit rows")
    first, last = history[0], history[-1]
    states: list[str] = []
    for row in history:
        if not states or states[-1] != row.state.value:
            states.append(row.state.value)
    warned = next((r for r in history if r.state is DrainState.WARNED), None)
    checkpoint_rows = _end_rows(history, DrainState.CHECKPOINTING)
    ended_how, ended_at = task_outcome(history)
    if last.state is DrainState.FAILED:
        outcome = "failed"
    elif last.state is DrainState.ABORTED:
        outcome = "aborted"
    else:
        outcome = ended_how
    platform_fault = any(bool(row.detail.get("platform_fault")) for row in history)
    return DrainReport(
        drain_id=first.drain_id,
        task_id=first.task_id,
        tenant_id=first.tenant_id,
        final_state=last.state,
        outcome=outcome,
        reason=str(last.detail.get("reason", "")) if last.state in TERMINAL_STATES else "",
        seconds=(last.recorded_at - first.recorded_at).total_seconds(),
        states=tuple(states),
        drain_signal_at=warned.recorded_at if warned else None,
        task_ended_at=ended_at,
        checkpoint=checkpoint_rows[-1].status if checkpoint_rows else None,
        platform_fault=platform_fault,
        decision_id=first.detail.get("decision_id"),
    )
