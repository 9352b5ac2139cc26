"""The shared base of the backends that observe a host but cannot act on it (dcgm, nvml).

Such a backend reads nodes, GPUs, samples and the tasks it can attribute; every action it
has no channel for (warning or checkpointing a task, cordoning, powering a node, and, unless
the backend overrides them, terminating or killing a task) answers UNSUPPORTED with the
backend's reason, never raises. A scrape shows state, not history: there are no task
lifecycle events, and a task's catalog entry is what `list_tasks` shows of it now. What such a
backend cannot observe of a task (its kind, QoS, priority and class) takes neutral defaults.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import polars as pl

from market_pipeline.hardware.naming import pool_id
from market_pipeline.hardware.protocol import (
    NodeInfo,
    NodeState,
    Outcome,
    OutcomeStatus,
    ResourceClass,
    TaskInfo,
    TaskKind,
    empty_task_events,
)


class ReadOnlyAdapter(abc.ABC):
    backend: str
    zone: str
    # why this backend cannot act, appended to every UNSUPPORTED outcome
    cannot_act_because: str

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or (lambda: datetime.now(timezone.utc))

    def now(self) -> datetime:
        return self._clock()

    @abc.abstractmethod
    def list_tasks(self) -> list[TaskInfo]: ...

    def _node(self, node_id: str, gpu_model: str, gpus: int, nvlink: bool) -> NodeInfo:
        """A node seen powered and serving (an observer sees no cordon, no power state)."""
        return NodeInfo(
            node_id=node_id,
            pool_id=pool_id(gpu_model, self.zone),
            gpu_model=gpu_model,
            zone=self.zone,
            gpus=gpus,
            state=NodeState.ON,
            nvlink=nvlink,
        )

    def _task(
        self,
        task_id: str,
        tenant_id: str,
        gpu_model: str,
        node_id: str,
        gpu_uuids: tuple[str, ...],
        gpu_milli: int,
        started_at: datetime,
        mem_mib: int,
        mig_profile: str | None,
        *,
        pid: int | None = None,
        do_not_drain: bool = False,
    ) -> TaskInfo:
        """A task as an observer sees it: kind, QoS, priority and class are not observable here
        (neutral defaults), and with no channel to its runtime it cannot checkpoint."""
        return TaskInfo(
            task_id=task_id,
            tenant_id=tenant_id,
            pool_id=pool_id(gpu_model, self.zone),
            node_id=node_id,
            gpu_uuids=gpu_uuids,
            gpu_milli=gpu_milli,
            kind=TaskKind.TRAINING,
            qos="unknown",
            priority=0,
            resource_class=ResourceClass.GUARANTEED,
            started_at=started_at,
            mem_mib=mem_mib,
            mig_profile=mig_profile,
            do_not_drain=do_not_drain,
            checkpointable=False,
            pid=pid,
        )

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
