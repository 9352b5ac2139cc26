"""One drain at a time per task: an exclusive lease, with the drain's journal beside it.

The lease is an `flock` on `<dir>/<task>.lock`, taken before a drain writes its first row
and held until it returns. The kernel drops it when the holder dies (kill -9 included), so
there is no expiry to tune: a second drain of the task while the first runs is refused
before it writes or sends anything, and a rerun after a crash gets the lease at once.

While it holds the lease, a drain mirrors its transitions into `<task>.journal.json`. A
drain whose audit store was process memory (`drain --audit memory`) and whose command was
killed resumes from that journal, like a warehouse-audited drain resumes from its rows:
with its warning's time, and without repeating a signal it already sent.

The journal also names the task's process (pid and create time) when the lease was given
it. A journal whose process has exited and whose pid now belongs to another process is
stale: `stale_journals` finds those, so that the drain they belong to can be closed rather
than left open for ever (see the CLI's `drain --pid`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market_pipeline.drain.protocol import (
    TERMINAL_STATES,
    DrainState,
    DrainTransition,
    Phase,
)
from market_pipeline.warehouse.control import ControlStore, LockBusy

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig


class DrainBusy(ValueError):
    """Another drain holds this task's lease; names the task and the holder."""


def _key(task_id: str) -> str:
    """A file name for any task id: readable prefix plus a hash (ids may hold any character)."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)[:60]
    return f"{readable}-{hashlib.sha256(task_id.encode()).hexdigest()[:12]}"


def transition_to_dict(row: DrainTransition) -> dict[str, Any]:
    return {
        "drain_id": row.drain_id,
        "seq": row.seq,
        "state": row.state.value,
        "phase": row.phase.value,
        "recorded_at": row.recorded_at.isoformat(),
        "task_id": row.task_id,
        "node_id": row.node_id,
        "tenant_id": row.tenant_id,
        "detail": dict(row.detail),
    }


def transition_from_dict(data: dict[str, Any]) -> DrainTransition:
    return DrainTransition(
        drain_id=data["drain_id"],
        seq=int(data["seq"]),
        state=DrainState(data["state"]),
        phase=Phase(data["phase"]),
        recorded_at=datetime.fromisoformat(data["recorded_at"]),
        task_id=data["task_id"],
        node_id=data["node_id"],
        tenant_id=data["tenant_id"],
        detail=data["detail"],
    )


class TaskLease:
    """Context manager: hold the drain lease of one task (DrainBusy if another run has it)."""

    def __init__(self, directory: Path, task_id: str, process: tuple[int, float] | None = None) -> None:
        self.task_id = task_id
        self.process = process  # (pid, create time) of the task's root, written to the journal
        self.lock_path = directory / f"{_key(task_id)}.lock"
        self.journal_path = directory / f"{_key(task_id)}.journal.json"
        self._fd: int | None = None

    def __enter__(self) -> "TaskLease":
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DrainBusy(
                f"task {self.task_id} is being drained by another run ({holder}); nothing was sent"
            ) from None
        # The lock file is never replaced or removed: the lock lives on its inode.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    # -- the journal ---------------------------------------------------------------------
    def _journal_text(self) -> str | None:
        """The journal as written (None: there is none)."""
        try:
            return self.journal_path.read_text()
        except FileNotFoundError:
            return None

    def _write_journal(self, text: str | None) -> None:
        """Replace the journal atomically (None: remove it)."""
        if text is None:
            self.journal_path.unlink(missing_ok=True)
            return
        tmp = self.journal_path.with_name(f"{self.journal_path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.journal_path)

    def _held(self) -> bool:
        return self._fd is not None

    def journal(self) -> list[DrainTransition]:
        """The rows of the task's last unfinished drain (empty if none or unreadable)."""
        try:
            text = self._journal_text()
            return [] if text is None else [transition_from_dict(row) for row in json.loads(text)["rows"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []  # a torn or foreign file: the audit store stays the authority

    def _recorded_process(self) -> dict[str, Any] | None:
        try:
            text = self._journal_text()
            process = None if text is None else json.loads(text).get("process")
        except (OSError, ValueError, AttributeError):
            return None
        return process if isinstance(process, dict) else None

    def open_drain_id(self) -> str | None:
        rows = self.journal()
        return rows[0].drain_id if rows else None

    def record(self, history: Sequence[DrainTransition]) -> None:
        """Mirror the drain's rows (called after every append, before the adapter acts)."""
        if not self._held():
            raise RuntimeError(f"lease of task {self.task_id} is not held")
        if history and history[-1].state in TERMINAL_STATES:
            self._write_journal(None)  # finished: nothing left to resume
            return
        process = {"pid": self.process[0], "create_time": self.process[1]} if self.process else None
        payload = {
            "task_id": self.task_id,
            "owner_pid": os.getpid(),
            "process": process or self._recorded_process(),  # a resumed run keeps what was known
            "rows": [transition_to_dict(r) for r in history],
        }
        self._write_journal(json.dumps(payload, default=str))


JOURNAL_STORE = "drain_leases"  # the control store's blobs holding the cluster profile's journals


class ControlTaskLease(TaskLease):
    """The cluster profile's drain lease: a PostgreSQL advisory lock named after the task, held
    on a connection of its own (the server drops it when the holder dies, as the kernel drops an
    `flock`), with the journal a blob of the control store, so a drain started on one worker is
    refused on another and resumed anywhere."""

    def __init__(self, control: ControlStore, task_id: str, process: tuple[int, float] | None = None) -> None:
        self.task_id = task_id
        self.process = process
        self.control = control
        self.name = _key(task_id)
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> "ControlTaskLease":
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self.control.lock(f"drain:{self.task_id}", 0))
        except LockBusy as exc:
            raise DrainBusy(
                f"task {self.task_id} is being drained by another run ({exc}); nothing was sent"
            ) from None
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def _held(self) -> bool:
        return self._stack is not None

    def _journal_text(self) -> str | None:
        body = self.control.blob(JOURNAL_STORE, self.name)
        return None if body is None else body.decode("utf-8", errors="replace")

    def _write_journal(self, text: str | None) -> None:
        self.control.put_blobs(JOURNAL_STORE, [(self.name, None if text is None else text.encode())])


JOURNAL_MAX_BYTES = 8 << 20  # a journal holds one drain's rows: a larger file is not one


@dataclass(frozen=True)
class StaleJournal:
    """An open drain journal whose task's process is gone and whose pid was reused."""

    task_id: str
    drain_id: str
    pid: int
    create_time: float | None  # the task's process, as recorded (None: not recorded)
    task: dict[str, Any]  # the task snapshot of the drain's first row


def stale_journals(
    directory: Path, pid: int, live_create_time: float, tolerance: float = 0.05
) -> list[StaleJournal]:
    """Open journals in `directory` of a task whose process had pid `pid` but another
    create time than the process that has that pid now (`live_create_time`): the pid was
    reused. Journals from before the create time was recorded compare the task's start."""
    found = []
    for path in sorted(directory.glob("*.journal.json")) if directory.is_dir() else []:
        try:
            if path.stat().st_size > JOURNAL_MAX_BYTES:
                continue
            data = json.loads(path.read_text())
            rows = [transition_from_dict(row) for row in data["rows"]]
            task = dict(rows[0].detail["task"])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue  # torn or foreign: not ours to close
        process = data.get("process") or {}
        recorded_pid = process.get("pid", task.get("pid"))
        if recorded_pid != pid or not rows or rows[-1].state in TERMINAL_STATES:
            continue
        created = process.get("create_time")
        if created is None:
            try:
                started = datetime.fromisoformat(task["started_at"]).timestamp()
            except (KeyError, TypeError, ValueError):
                continue
            same = abs(started - live_create_time) <= 1.0
        else:
            same = abs(float(created) - live_create_time) <= tolerance
        if not same:
            found.append(StaleJournal(rows[0].task_id or "", rows[0].drain_id, pid, created, task))
    return found


def lease_dir_for(config: MarketPipelineConfig) -> Path:
    """Where drain leases live: next to the adapter's state, shared by CLI and Dagster runs."""
    return config.resolve_path(config.adapter.state_path).parent / "drain_leases"
