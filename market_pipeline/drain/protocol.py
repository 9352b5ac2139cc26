"""The task-drain protocol as a persisted state machine (task drainability, node level).

requested -> warned -> checkpointing -> terminating -> killed -> released -> reported,
or failed / aborted with a reason. Every transition is one row of the drain audit log.

Steps with a side effect on the task (warn, checkpoint, terminate, kill) are written
ahead: a `begin` row is appended before the adapter is called and an `end` row with the
step's outcome after it. A run that crashes in between leaves a `begin` without an `end`;
the resuming run closes it as `interrupted` and moves on, so a signal is never sent twice
(at-most-once per step). The one exception is a SIGKILL after which the task is provably
still alive: that kill was never delivered, so sending it is not a repeat.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from market_pipeline.hardware.protocol import ResourceClass, TaskInfo, TaskKind


class DrainState(str, enum.Enum):
    REQUESTED = "requested"
    WARNED = "warned"
    CHECKPOINTING = "checkpointing"
    TERMINATING = "terminating"
    KILLED = "killed"
    RELEASED = "released"
    REPORTED = "reported"
    FAILED = "failed"
    ABORTED = "aborted"


class Phase(str, enum.Enum):
    BEGIN = "begin"  # the step's action is about to run
    END = "end"  # the step's action returned (its outcome is in the detail)
    ONLY = "only"  # a step without side effect: one row


TERMINAL_STATES = frozenset({DrainState.REPORTED, DrainState.FAILED, DrainState.ABORTED})
SIDE_EFFECT_STATES = frozenset(
    {DrainState.WARNED, DrainState.CHECKPOINTING, DrainState.TERMINATING, DrainState.KILLED}
)

# Which state may follow a completed step (an END or ONLY row).
ALLOWED_NEXT: Mapping[DrainState | None, frozenset[DrainState]] = {
    None: frozenset({DrainState.REQUESTED}),
    DrainState.REQUESTED: frozenset(
        {DrainState.WARNED, DrainState.KILLED, DrainState.ABORTED, DrainState.FAILED}
    ),
    DrainState.WARNED: frozenset(
        {DrainState.CHECKPOINTING, DrainState.RELEASED, DrainState.KILLED, DrainState.FAILED}
    ),
    DrainState.CHECKPOINTING: frozenset(
        {DrainState.TERMINATING, DrainState.RELEASED, DrainState.KILLED, DrainState.FAILED}
    ),
    DrainState.TERMINATING: frozenset({DrainState.KILLED, DrainState.RELEASED, DrainState.FAILED}),
    # KILLED -> KILLED only after an interrupted kill whose target is still alive.
    DrainState.KILLED: frozenset({DrainState.KILLED, DrainState.RELEASED, DrainState.FAILED}),
    DrainState.RELEASED: frozenset({DrainState.REPORTED, DrainState.FAILED}),
}

# End-row statuses beyond OutcomeStatus values.
STATUS_INTERRUPTED = "interrupted"  # the run crashed inside the step
STATUS_SKIPPED = "skipped"  # the step had nothing to do (e.g. no checkpoint support)


class DrainProtocolError(ValueError):
    """A transition the state machine does not allow; names the drain and the states."""


class DuplicateStepError(DrainProtocolError):
    """Another run already appended this step (same drain id and sequence number)."""


@dataclass(frozen=True)
class DrainTransition:
    drain_id: str
    seq: int
    state: DrainState
    phase: Phase
    recorded_at: datetime
    task_id: str | None = None
    node_id: str | None = None
    tenant_id: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str | None:
        return self.detail.get("status")


def check_transition(history: Sequence[DrainTransition], new: DrainTransition) -> None:
    """Raise DrainProtocolError unless `new` may follow `history` (ordered by seq)."""
    expected_seq = len(history)
    if new.seq != expected_seq:
        raise DrainProtocolError(f"drain {new.drain_id}: seq {new.seq} appended after {expected_seq} rows")
    last = history[-1] if history else None
    if last is not None and last.state in TERMINAL_STATES:
        raise DrainProtocolError(f"drain {new.drain_id}: {new.state.value} after terminal {last.state.value}")
    if last is not None and last.phase is Phase.BEGIN:
        if new.state is not last.state or new.phase is not Phase.END:
            raise DrainProtocolError(
                f"drain {new.drain_id}: open step {last.state.value} must end before "
                f"{new.state.value}/{new.phase.value}"
            )
        return
    if new.phase is Phase.END:
        raise DrainProtocolError(f"drain {new.drain_id}: end of {new.state.value} without begin")
    allowed = ALLOWED_NEXT.get(last.state if last else None, frozenset())
    if new.state not in allowed:
        previous = last.state.value if last else "<start>"
        raise DrainProtocolError(
            f"drain {new.drain_id}: {previous} -> {new.state.value} is not a protocol transition"
        )
    if last is not None and last.state is DrainState.KILLED and new.state is DrainState.KILLED:
        if not (last.status == STATUS_INTERRUPTED and last.detail.get("alive_after")):
            raise DrainProtocolError(
                f"drain {new.drain_id}: a kill may only be resent after an undelivered kill"
            )
    expects_begin = new.state in SIDE_EFFECT_STATES
    if expects_begin != (new.phase is Phase.BEGIN):
        raise DrainProtocolError(
            f"drain {new.drain_id}: {new.state.value} must be written "
            f"{'as begin/end' if expects_begin else 'as one row'}"
        )


class DrainAuditStore(Protocol):
    """Where drain transitions persist; a restarted run resumes from what is here."""

    def load_states(self, drain_id: str) -> list[DrainTransition]:
        """All transitions of one drain, ordered by seq."""
        ...

    def append(self, transition: DrainTransition) -> None:
        """Persist one transition; raise DuplicateStepError if its seq is taken."""
        ...

    def open_drain_ids(self, task_id: str) -> list[str]:
        """Drains of this task that have not reached a terminal state."""
        ...


class InMemoryAuditStore:
    """A process-local audit store (fault-injection tests, `drain --audit memory`)."""

    def __init__(self) -> None:
        self._rows: dict[str, list[DrainTransition]] = {}
        self.billing_events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def load_states(self, drain_id: str) -> list[DrainTransition]:
        with self._lock:
            return list(self._rows.get(drain_id, []))

    def append(self, transition: DrainTransition) -> None:
        with self._lock:
            history = self._rows.setdefault(transition.drain_id, [])
            if transition.seq < len(history):
                raise DuplicateStepError(f"drain {transition.drain_id}: seq {transition.seq} already written")
            check_transition(history, transition)
            history.append(transition)
            billing = transition.detail.get("billing")
            if transition.state in TERMINAL_STATES and billing is not None:
                self.billing_events.append(dict(billing))

    def open_drain_ids(self, task_id: str) -> list[str]:
        with self._lock:
            return [
                drain_id
                for drain_id, rows in self._rows.items()
                if rows and rows[0].task_id == task_id and rows[-1].state not in TERMINAL_STATES
            ]

    def drain_ids(self) -> list[str]:
        with self._lock:
            return list(self._rows)


# -- task snapshots: a drain remembers the task it was asked to drain ----------------------


def task_to_dict(task: TaskInfo) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "tenant_id": task.tenant_id,
        "pool_id": task.pool_id,
        "node_id": task.node_id,
        "gpu_uuids": list(task.gpu_uuids),
        "gpu_milli": task.gpu_milli,
        "kind": task.kind.value,
        "qos": task.qos,
        "priority": task.priority,
        "resource_class": task.resource_class.value,
        "started_at": task.started_at.isoformat(),
        "mem_mib": task.mem_mib,
        "mig_profile": task.mig_profile,
        "do_not_drain": task.do_not_drain,
        "checkpointable": task.checkpointable,
        "pid": task.pid,
    }


def task_from_dict(data: Mapping[str, Any]) -> TaskInfo:
    try:
        return TaskInfo(
            task_id=str(data["task_id"]),
            tenant_id=str(data["tenant_id"]),
            pool_id=str(data["pool_id"]),
            node_id=str(data["node_id"]),
            gpu_uuids=tuple(data["gpu_uuids"]),
            gpu_milli=int(data["gpu_milli"]),
            kind=TaskKind(data["kind"]),
            qos=str(data["qos"]),
            priority=int(data["priority"]),
            resource_class=ResourceClass(data["resource_class"]),
            started_at=datetime.fromisoformat(data["started_at"]),
            mem_mib=int(data.get("mem_mib", 0)),
            mig_profile=data.get("mig_profile"),
            do_not_drain=bool(data.get("do_not_drain", False)),
            checkpointable=bool(data.get("checkpointable", True)),
            pid=data.get("pid"),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise DrainProtocolError(f"task snapshot is malformed: {exc!r}") from exc
