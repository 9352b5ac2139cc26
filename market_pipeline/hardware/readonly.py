"""The shared base of the backends that observe a host but cannot act on it (dcgm, nvml).

Such a backend reads nodes, GPUs, samples and the tasks it can attribute; every action it
has no channel for (warning or checkpointing a task, cordoning, powering a node, and, unless
the backend overrides them, terminating or killing a task) answers UNSUPPORTED with the
backend's reason, never raises. A scrape shows state, not history: there are no task
lifecycle events, and a task's catalog entry is what `list_tasks` shows of it now.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import polars as pl

from market_pipeline.hardware.protocol import Outcome, OutcomeStatus, TaskInfo, empty_task_events


class ReadOnlyAdapter(abc.ABC):
    backend: str
    # why this backend cannot act, appended to every UNSUPPORTED outcome
    cannot_act_because: str

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or (lambda: datetime.now(timezone.utc))

    def now(self) -> datetime:
        return self._clock()

    @abc.abstractmethod
    def list_tasks(self) -> list[TaskInfo]: ...

    def read_task_events(self, start: datetime, end: datetime) -> pl.DataFrame:
        return empty_task_events()

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        wanted = set(task_ids)
        return [task for task in self.list_tasks() if task.task_id in wanted]

    # -- acting: UNSUPPORTED unless the backend overrides it ----------------------------------
    def _unsupported(self, what: str) -> Outcome:
        return Outcome(
            OutcomeStatus.UNSUPPORTED, f"{self.backend} backend cannot {what}: {self.cannot_act_because}"
        )

    def warn_task(self, task_id: str, deadline_seconds: float) -> Outcome:
        return self._unsupported(f"warn task {task_id}")

    def checkpoint_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        return self._unsupported(f"checkpoint task {task_id}")

    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        return self._unsupported(f"terminate task {task_id}")

    def kill_task(self, task_id: str) -> Outcome:
        return self._unsupported(f"kill task {task_id}")

    def cordon(self, node_id: str) -> Outcome:
        return self._unsupported(f"cordon {node_id}")

    def uncordon(self, node_id: str) -> Outcome:
        return self._unsupported(f"uncordon {node_id}")

    def power_on(self, node_id: str) -> Outcome:
        return self._unsupported(f"power on {node_id}")

    def power_off(self, node_id: str) -> Outcome:
        return self._unsupported(f"power off {node_id}")
