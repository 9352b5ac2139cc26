"""The task registry of the `local-process` backend: one JSON file shared by processes.

The CLI, a Dagster run and a test may all drive the same tasks, so the registry lives on
disk; writers hold an exclusive `flock` for the read-modify-write and replace the file
atomically, readers see either the old or the new version.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from market_pipeline.file_lock import exclusive_lock
from market_pipeline.hardware.local_process import processes as osp

REGISTRY_VERSION = 1


class RegistryError(ValueError):
    """The registry file is unreadable or locked for too long; names the file."""


def new_record(
    task_id: str,
    tenant_id: str,
    pid: int,
    start_ticks: int | None,
    gpu_uuids: Sequence[str],
    gpu_milli: int,
    kind: str,
    qos: str,
    priority: int,
    resource_class: str,
    do_not_drain: bool,
    checkpointable: bool,
    mem_mib: int,
    started_at: str,
) -> dict[str, Any]:
    """One task's registry entry (JSON-ready); `ended_at` stays None while it runs."""
    return {
        "task_id": task_id,
        "tenant_id": tenant_id,
        "pid": pid,
        "start_ticks": start_ticks,
        "gpu_uuids": list(gpu_uuids),
        "gpu_milli": gpu_milli,
        "kind": kind,
        "qos": qos,
        "priority": priority,
        "resource_class": resource_class,
        "do_not_drain": do_not_drain,
        "checkpointable": checkpointable,
        "mem_mib": mem_mib,
        "started_at": started_at,
        "ended_at": None,
        "end_reason": None,
        "exit_code": None,
        "drain_signal_at": None,
        "worker": False,
        "checkpoint_path": None,
        "metrics_path": None,
        # psutil create time of the root, and the task's processes seen so far
        "create_time": None,
        "members": [],
    }


def iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat()


def root_created(record: dict[str, Any]) -> float | None:
    """The root's create time; for a record from before psutil, checked by its start ticks
    (-1 never matches: the pid now belongs to another process)."""
    if record.get("create_time") is not None or record.get("start_ticks") is None:
        return record.get("create_time")
    return None if osp.proc_start_ticks(record["pid"]) == record["start_ticks"] else -1.0


def exit_note(record: dict[str, Any]) -> str:
    return f" (exit code {record['exit_code']})" if record.get("exit_code") is not None else ""


def add_event(reg: dict[str, Any], task_id: str, event: str, reason: str, ts: datetime | None = None) -> None:
    """Append a task lifecycle event (the metering source) to the registry."""
    reg["events"].append(
        {
            "ts": iso(ts or datetime.now(timezone.utc)),
            "task_id": task_id,
            "event": event,
            "reason": reason,
            "platform_fault": False,
        }
    )


def mark_ended(reg: dict[str, Any], record: dict[str, Any], why: str, code: int | None) -> None:
    """Close the task: ended now, `drained` after a drain's warning, else `failed` or `end`."""
    record["ended_at"] = iso(datetime.now(timezone.utc))
    record["exit_code"] = code
    if record.get("drain_signal_at"):
        record["end_reason"], event = "drained", "drained"
    elif code not in (None, 0):
        record["end_reason"], event = "failed", "failed"
    else:
        record["end_reason"], event = "end", "end"
    add_event(reg, record["task_id"], event, f"{why}{exit_note(record)}")


def prune_ended(data: dict[str, Any], older_than: datetime) -> int:
    """Forget tasks that ended before `older_than`, and their events; returns how many."""
    gone = {
        tid
        for tid, r in data["tasks"].items()
        if r["ended_at"] is not None and datetime.fromisoformat(r["ended_at"]) < older_than
    }
    for task_id in gone:
        del data["tasks"][task_id]
    data["events"] = [e for e in data["events"] if e["task_id"] not in gone]
    return len(gone)


def empty_registry() -> dict[str, Any]:
    return {"version": REGISTRY_VERSION, "tasks": {}, "events": [], "cordoned": []}


class TaskRegistry:
    def __init__(self, path: Path, lock_timeout_seconds: float = 10.0) -> None:
        self.path = path
        self.lock_timeout_seconds = lock_timeout_seconds

    def read(self) -> dict[str, Any]:
        if not self.path.exists():
            return empty_registry()
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RegistryError(f"local-process registry {self.path} is unreadable: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != REGISTRY_VERSION:
            raise RegistryError(f"local-process registry {self.path}: expected version {REGISTRY_VERSION}")
        return data

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        """Exclusive read-modify-write; the yielded mapping is saved on a clean exit."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        with exclusive_lock(
            lock_path,
            self.lock_timeout_seconds,
            lambda: RegistryError(
                f"local-process registry lock {lock_path} held for over {self.lock_timeout_seconds}s"
            ),
            poll_seconds=0.01,
        ):
            data = self.read()
            before = json.dumps(data, sort_keys=True)
            yield data
            after = json.dumps(data, sort_keys=True)
            if after != before or not self.path.exists():  # polls mostly change nothing
                tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(after)
                os.replace(tmp, self.path)
