"""Steps one drain through the node adapter, persisting every transition before moving on.

`DrainExecutor.run` is idempotent per drain id: called again for a drain that already
finished it returns the stored report without touching the task; called for a drain that a
crashed run left half-way it resumes from the audit log (see drain.protocol).
With a lease directory, a run holds the task's lease (drain.lease) throughout, so no
two drains of one task ever act at once, whichever audit store each one writes to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from market_pipeline.drain.calls import (
    Clock,
    StepCaller,
    StepResult,
    SystemClock,
    ThreadedStepCaller,
)
from market_pipeline.drain.lease import DrainBusy, TaskLease
from market_pipeline.drain.outcome import task_fault, terminal_detail
from market_pipeline.drain.protocol import (
    STATUS_INTERRUPTED,
    STATUS_SKIPPED,
    DrainAuditStore,
    DrainState,
    DrainTransition,
    Phase,
    check_transition,
    task_from_dict,
    task_to_dict,
)
from market_pipeline.drain.steps import (
    DrainReport,
    DrainTiming,
    Step,
    next_step,
    remaining_seconds,
    summarize,
)
from market_pipeline.hardware.protocol import NodeAdapter, Outcome, OutcomeStatus, TaskInfo


@dataclass(frozen=True)
class DrainRequest:
    drain_id: str
    task: TaskInfo
    reasons: tuple[str, ...] = ()
    decision_id: str | None = None
    abort_reason: str | None = None  # set by the caller to record a drain refused up front
    note: str | None = None  # added to the reason of the drain's terminal row (e.g. why it closes)


class DrainExecutor:
    def __init__(
        self,
        adapter: NodeAdapter,
        store: DrainAuditStore,
        timing: DrainTiming,
        *,
        grace_seconds: float = 0.0,
        clock: Clock | None = None,
        caller: StepCaller | None = None,
        lease_dir: Path | None = None,
        lease: TaskLease | None = None,
        leases: Callable[[str], TaskLease] | None = None,
    ) -> None:
        self.adapter = adapter
        self.store = store
        self.timing = timing
        self.grace_seconds = grace_seconds
        self.clock = clock or SystemClock()
        self.caller = caller or ThreadedStepCaller()
        self.lease_dir = lease_dir
        self.leases = leases  # a task's lease by its id (the cluster profile's, in PostgreSQL)
        self.held_lease = lease  # a lease the caller already holds (taken before its store)
        self._lease: TaskLease | None = None
        self._note: str | None = None

    # -- entry point ----------------------------------------------------------------------
    def run(self, request: DrainRequest) -> DrainReport:
        """Run or resume one drain; DrainBusy (nothing written) if another run holds the task."""
        if self.held_lease is not None:
            lease, hold = self.held_lease, contextlib.nullcontext()
        elif self.leases is not None:
            lease = hold = self.leases(request.task.task_id)
        elif self.lease_dir is not None:
            lease = hold = TaskLease(self.lease_dir, request.task.task_id)
        else:
            lease, hold = None, contextlib.nullcontext()
        with hold:
            self._lease, self._note = lease, request.note
            try:
                history = self.store.load_states(request.drain_id) or self._restore(request)
                if not history:
                    history = self._start(request)
                while True:
                    move = next_step(history, self.clock.now(), self._timing_of(history))
                    if move.step is Step.DONE:
                        return summarize(history)
                    history = self._perform(move.step, move.why, history)
            finally:
                self._lease, self._note = None, None

    def _restore(self, request: DrainRequest) -> list[DrainTransition]:
        """The rows a killed run of this drain left in the lease's journal, copied into an
        audit store that lost them (process memory); empty when there are none."""
        rows = self._lease.journal() if self._lease else []
        if not rows:
            return []
        if rows[0].drain_id != request.drain_id:
            raise DrainBusy(
                f"task {request.task.task_id} has an unfinished drain "
                f"{rows[0].drain_id} whose run stopped; resume that one first"
            )
        for row in rows:
            self.store.append(row)
        return rows

    # -- persistence ----------------------------------------------------------------------
    def _append(
        self, history: list[DrainTransition], state: DrainState, phase: Phase, detail: dict[str, Any]
    ) -> list[DrainTransition]:
        first = history[0] if history else None
        row = DrainTransition(
            drain_id=first.drain_id if first else detail["drain_id"],
            seq=len(history),
            state=state,
            phase=phase,
            recorded_at=self.clock.now(),
            task_id=first.task_id if first else detail["task"]["task_id"],
            node_id=first.node_id if first else detail["task"]["node_id"],
            tenant_id=first.tenant_id if first else detail["task"]["tenant_id"],
            detail={k: v for k, v in detail.items() if k != "drain_id"},
        )
        check_transition(history, row)
        self.store.append(row)
        history = [*history, row]
        if self._lease is not None:
            self._lease.record(history)  # before the adapter acts, like the audit row
        return history

    def _start(self, request: DrainRequest) -> list[DrainTransition]:
        detail = {
            "drain_id": request.drain_id,
            "phase": Phase.ONLY.value,
            "task": task_to_dict(request.task),
            "reasons": list(request.reasons),
            "decision_id": request.decision_id,
            "timing": self.timing.to_dict(),
            "grace_seconds": self.grace_seconds,
        }
        history = self._append([], DrainState.REQUESTED, Phase.ONLY, detail)
        if request.abort_reason:
            history = self._terminal(history, DrainState.ABORTED, request.abort_reason, False)
        return history

    @staticmethod
    def _timing_of(history: list[DrainTransition]) -> DrainTiming:
        return DrainTiming.from_dict(history[0].detail["timing"])

    @staticmethod
    def _task_of(history: list[DrainTransition]) -> TaskInfo:
        return task_from_dict(history[0].detail["task"])

    # -- steps ------------------------------------------------------------------------------
    def _perform(self, step: Step, why: str, history: list[DrainTransition]) -> list[DrainTransition]:
        if step is Step.CLOSE_INTERRUPTED:
            return self._close_interrupted(history)
        if step is Step.WARN:
            return self._warn(history)
        if step is Step.CHECKPOINT:
            return self._checkpoint(history)
        if step is Step.TERMINATE:
            return self._signal_step(history, Step.TERMINATE, DrainState.TERMINATING, why)
        if step is Step.KILL:
            return self._signal_step(history, Step.KILL, DrainState.KILLED, why)
        if step is Step.VERIFY:
            return self._verify(history)
        if step is Step.REPORT:
            return self._report(history)
        if step is Step.FAIL:
            # The only failing step rule is a kill the adapter could not carry out.
            return self._terminal(history, DrainState.FAILED, why, True)
        raise AssertionError(f"unhandled step {step}")

    def _precheck(self, history: list[DrainTransition]) -> str | None:
        """Why this drain must not start now, or None (re-read right before the warning)."""
        task = self._task_of(history)
        others = [d for d in self.store.open_drain_ids(task.task_id) if d != history[0].drain_id]
        if others:
            return f"duplicate: task {task.task_id} is already being drained by {others[0]}"
        if task.do_not_drain:
            return f"do_not_drain: task {task.task_id} is protected"
        found: list[TaskInfo] = []
        result = self.caller.call(
            lambda: self._find_task(task.task_id, found), self.timing.call_margin_seconds
        )
        if result.status != OutcomeStatus.OK.value:
            return f"precheck_failed: cannot list tasks ({result.status}: {result.detail})"
        if found:
            current = found[0]
            if current.do_not_drain:
                return f"do_not_drain: task {task.task_id} became protected"
            if current.started_at != task.started_at:
                return (
                    f"task_changed: {task.task_id} restarted at "
                    f"{current.started_at.isoformat()} after the drain was decided"
                )
        return None

    def _find_task(self, task_id: str, sink: list[TaskInfo]) -> Outcome:
        sink.extend(t for t in self.adapter.list_tasks() if t.task_id == task_id)
        return Outcome.success()

    def _task_running(self, task_id: str) -> bool | None:
        """True/False from the adapter; None when the adapter cannot tell right now."""
        found: list[TaskInfo] = []
        result = self.caller.call(lambda: self._find_task(task_id, found), self.timing.call_margin_seconds)
        if result.status != OutcomeStatus.OK.value:
            return None
        return bool(found)

    def _wait_for_exit(self, task_id: str, until: datetime) -> bool:
        """Poll until the task is gone (True) or `until` passes (False)."""
        while True:
            if self._task_running(task_id) is False:
                return True
            left = (until - self.clock.now()).total_seconds()
            if left <= 0:
                return False
            self.clock.sleep(min(self.timing.poll_seconds, left))

    def _warn(self, history: list[DrainTransition]) -> list[DrainTransition]:
        refusal = self._precheck(history)
        if refusal:
            return self._terminal(history, DrainState.ABORTED, refusal, False)
        task, timing = self._task_of(history), self._timing_of(history)
        notice = timing.checkpoint_timeout_seconds if task.checkpointable else timing.warn_seconds
        notice = max(0.0, min(notice, remaining_seconds(history, self.clock.now(), timing)))
        history = self._append(
            history, DrainState.WARNED, Phase.BEGIN, {"phase": "begin", "notice_seconds": notice}
        )
        result = self.caller.call(
            lambda: self.adapter.warn_task(task.task_id, notice), timing.call_margin_seconds
        )
        return self._end(history, DrainState.WARNED, Step.WARN, result, {})

    def _checkpoint(self, history: list[DrainTransition]) -> list[DrainTransition]:
        task, timing = self._task_of(history), self._timing_of(history)
        budget = max(0.0, remaining_seconds(history, self.clock.now(), timing))
        history = self._append(
            history,
            DrainState.CHECKPOINTING,
            Phase.BEGIN,
            {"phase": "begin", "checkpointable": task.checkpointable},
        )
        result = None
        if task.checkpointable:
            wait = min(timing.checkpoint_timeout_seconds, budget)
            result = self.caller.call(
                lambda: self.adapter.checkpoint_task(task.task_id, wait), wait + timing.call_margin_seconds
            )
            if result.status != OutcomeStatus.UNSUPPORTED.value:
                return self._end(history, DrainState.CHECKPOINTING, Step.CHECKPOINT, result, {})
        # No checkpoint hook: the task gets the rest of its notice to wrap up by itself.
        started = self.clock.now()
        exited = self._rest_of_notice(history, task.task_id, timing)
        waited = (self.clock.now() - started).total_seconds()
        note = result.detail if result else "task declares no checkpoint support"
        status = OutcomeStatus.GONE.value if exited else STATUS_SKIPPED
        outcome = StepResult(status, f"{note}; waited {waited:.2f}s of notice", waited, False)
        return self._end(history, DrainState.CHECKPOINTING, Step.CHECKPOINT, outcome, {})

    def _rest_of_notice(self, history: list[DrainTransition], task_id: str, timing: DrainTiming) -> bool:
        """Wait until the notice announced by the warning has passed (within the drain's
        budget) or the task exits (True). The warning's time is its persisted begin row, so
        a run resumed after a crash still gives the full notice before SIGTERM."""
        rows = [r for r in history if r.state is DrainState.WARNED]
        if not rows:
            return self._task_running(task_id) is False
        # From the end row when the warning call returned (it was delivered by then), else
        # from the begin row (a crash inside the call: it may have gone out right then).
        start = rows[-1] if rows[-1].phase is Phase.END and rows[-1].status != STATUS_INTERRUPTED else rows[0]
        notice = float(rows[0].detail.get("notice_seconds", 0))
        end = start.recorded_at + timedelta(seconds=notice)
        budget = max(0.0, remaining_seconds(history, self.clock.now(), timing))
        return self._wait_for_exit(task_id, min(end, self.clock.now() + timedelta(seconds=budget)))

    def _signal_step(
        self, history: list[DrainTransition], step: Step, state: DrainState, why: str
    ) -> list[DrainTransition]:
        task, timing = self._task_of(history), self._timing_of(history)
        history = self._append(history, state, Phase.BEGIN, {"phase": "begin", "why": why})
        if step is Step.TERMINATE:
            wait = max(
                0.0,
                min(timing.terminate_timeout_seconds, remaining_seconds(history, self.clock.now(), timing)),
            )
            result = self.caller.call(
                lambda: self.adapter.terminate_task(task.task_id, wait), wait + timing.call_margin_seconds
            )
        else:
            result = self.caller.call(
                lambda: self.adapter.kill_task(task.task_id),
                timing.kill_timeout_seconds + timing.call_margin_seconds,
            )
        return self._end(history, state, step, result, {})

    def _end(
        self,
        history: list[DrainTransition],
        state: DrainState,
        step: Step,
        result: StepResult,
        extra: dict[str, Any],
    ) -> list[DrainTransition]:
        detail = {"phase": "end", **result.as_detail(), **extra}
        detail["platform_fault"] = task_fault(step, result)
        return self._append(history, state, Phase.END, detail)

    def _close_interrupted(self, history: list[DrainTransition]) -> list[DrainTransition]:
        """Close a step a crashed run left open, without repeating its action."""
        open_row = history[-1]
        task, timing = self._task_of(history), self._timing_of(history)
        detail: dict[str, Any] = {
            "phase": "end",
            "status": STATUS_INTERRUPTED,
            "detail": "run stopped inside this step; not repeated",
            "platform_fault": False,
        }
        if open_row.state in (DrainState.TERMINATING, DrainState.KILLED):
            # Give a SIGTERM that may have gone out its full grace before judging it.
            grace = (
                timing.terminate_timeout_seconds
                if open_row.state is DrainState.TERMINATING
                else timing.kill_timeout_seconds
            )
            until = min(
                open_row.recorded_at + timedelta(seconds=grace),
                self.clock.now()
                + timedelta(seconds=max(0.0, remaining_seconds(history, self.clock.now(), timing))),
            )
            detail["alive_after"] = not self._wait_for_exit(task.task_id, until)
        elif open_row.state is DrainState.CHECKPOINTING and self._rest_of_notice(
            history, task.task_id, timing
        ):
            # The stopped run spent part of the notice; the task had all of it, and left.
            detail.update(
                status=OutcomeStatus.GONE.value,
                detail="run stopped inside this step; the task exited in its notice",
            )
        return self._append(history, open_row.state, Phase.END, detail)

    def _verify(self, history: list[DrainTransition]) -> list[DrainTransition]:
        """Check the task's release until it holds or the release deadline passes, pausing
        between checks from the initial backoff, doubling up to the max (a driver may list
        an exited process for seconds). The same wait for every backend."""
        task, timing = self._task_of(history), self._timing_of(history)
        started = self.clock.now()
        deadline = started + timedelta(seconds=timing.release_timeout_seconds)
        pause = timing.release_backoff_initial_seconds
        attempt = 0
        while True:
            attempt += 1
            last = self._verify_once(task, timing)
            waited = (self.clock.now() - started).total_seconds()
            if last.status == OutcomeStatus.OK.value:
                return self._append(
                    history,
                    DrainState.RELEASED,
                    Phase.ONLY,
                    {
                        "phase": "only",
                        **last.as_detail(),
                        "attempts": attempt,
                        "waited_seconds": round(waited, 3),
                    },
                )
            if last.status == OutcomeStatus.GONE.value:
                return self._terminal(
                    history, DrainState.FAILED, f"node_vanished: cannot verify release ({last.detail})", True
                )
            left = (deadline - self.clock.now()).total_seconds()
            if left <= 0:
                return self._terminal(
                    history,
                    DrainState.FAILED,
                    f"not_released: {last.status}: {last.detail} "
                    f"(still so after {waited:.2f}s and {attempt} check(s); "
                    f"release_timeout_seconds={timing.release_timeout_seconds:g})",
                    True,
                )
            self.clock.sleep(min(pause, left))
            pause = min(pause * 2, timing.release_backoff_max_seconds)

    def _verify_once(self, task: TaskInfo, timing: DrainTiming) -> StepResult:
        running = self._task_running(task.task_id)
        if running is None:
            return StepResult(OutcomeStatus.FAILED.value, "cannot list tasks", 0.0, True)
        if running:
            return StepResult(OutcomeStatus.FAILED.value, f"task {task.task_id} is still running", 0.0, True)
        if task.gpu_milli < 1000 or not task.gpu_uuids:
            # A shared GPU keeps its other tenants: the task's share is what must be free.
            return StepResult(OutcomeStatus.OK.value, "task no longer holds its share of the GPU", 0.0, False)
        return self.caller.call(
            lambda: self.adapter.verify_released(task.gpu_uuids, task.task_id),
            timing.verify_timeout_seconds + timing.call_margin_seconds,
        )

    def _report(self, history: list[DrainTransition]) -> list[DrainTransition]:
        summary = summarize(history)
        return self._terminal(history, DrainState.REPORTED, f"drained: {summary.outcome}", False)

    def _terminal(
        self, history: list[DrainTransition], state: DrainState, reason: str, platform_fault: bool
    ) -> list[DrainTransition]:
        if self._note:
            reason = f"{reason}; {self._note}"
        detail = terminal_detail(
            history, self._task_of(history), state, reason, platform_fault, self.clock.now()
        )
        return self._append(history, state, Phase.ONLY, detail)
