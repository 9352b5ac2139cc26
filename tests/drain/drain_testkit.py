"""Test doubles for the task-drain tests: a fake clock, a scriptable fleet, a crashing store.

The fake fleet keeps the truth (which task is alive, which signal was delivered when) so
the tests can check the drain protocol's claims against it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import polars as pl

from market_pipeline.drain.protocol import DrainTransition, InMemoryAuditStore
from market_pipeline.hardware.protocol import (
    GpuInfo,
    NodeInfo,
    NodeState,
    Outcome,
    OutcomeStatus,
    ResourceClass,
    TaskInfo,
    TaskKind,
    empty_samples,
    empty_task_events,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
BEHAVIOURS = (
    "cooperative",
    "slow_checkpoint",
    "ignores_sigterm",
    "crashes_mid_drain",
    "already_gone",
    "exits_during_notice",
    "gpu_held_after_exit",
)
SIDE_EFFECTS = ("warn", "checkpoint", "terminate", "kill")
HANG_OVERSHOOT = 0.5
CALL_MARGIN = 5.0  # fault tests give the executor this margin; hangs overrun it slightly


class SimulatedCrash(BaseException):
    """The run dies here (BaseException: no `except Exception` may swallow it)."""


class FakeClock:
    def __init__(self, start: datetime = T0) -> None:
        self.t = start

    def now(self) -> datetime:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += timedelta(seconds=max(seconds, 0.0))


def make_task(
    task_id: str,
    *,
    tenant: str = "t1",
    pool: str = "p1",
    node: str = "n1",
    priority: int = 0,
    kind: TaskKind = TaskKind.TRAINING,
    checkpointable: bool = True,
    do_not_drain: bool = False,
    started_at: datetime = T0 - timedelta(hours=1),
    gpus: int = 1,
    gpu_milli: int = 1000,
    resource_class: ResourceClass = ResourceClass.DRAINABLE,
) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tenant_id=tenant,
        pool_id=pool,
        node_id=node,
        gpu_uuids=tuple(f"{node}-g{i}-{task_id}" for i in range(gpus)),
        gpu_milli=gpu_milli,
        kind=kind,
        qos="BE",
        priority=priority,
        resource_class=resource_class,
        started_at=started_at,
        do_not_drain=do_not_drain,
        checkpointable=checkpointable,
    )


@dataclass
class FakeTask:
    info: TaskInfo
    behaviour: str
    alive: bool = True
    died_at: datetime | None = None
    gpu_hold_seconds: float = 0.0  # the driver frees the GPU this long after the exit

    @property
    def gpu_free_at(self) -> datetime | None:
        if self.died_at is None:
            return None
        return self.died_at + timedelta(seconds=self.gpu_hold_seconds)


@dataclass
class FaultPlan:
    """Per-call probabilities of the platform misbehaving."""

    exception: float = 0.0
    hang: float = 0.0
    failed: float = 0.0
    node_vanish: float = 0.0
    crash_before: float = 0.0  # the run dies before the adapter acts
    crash_after: float = 0.0  # the run dies after the adapter acted, before it answered


class FakeFleetAdapter:
    backend = "fake"

    def __init__(
        self,
        clock: FakeClock,
        tasks: Sequence[tuple[TaskInfo, str]],
        nodes: Sequence[NodeInfo],
        rng: random.Random | None = None,
        faults: FaultPlan | None = None,
        checkpoint_seconds: float = 0.5,
    ) -> None:
        self.clock = clock
        self.rng = rng or random.Random(0)
        self.faults = faults or FaultPlan()
        self.nodes = {n.node_id: n for n in nodes}
        self.vanished: set[str] = set()
        self.tasks = {
            t.task_id: FakeTask(
                t, b, alive=b != "already_gone", died_at=None if b != "already_gone" else clock.now()
            )
            for t, b in tasks
        }
        for task in self.tasks.values():
            if task.behaviour == "gpu_held_after_exit":
                task.gpu_hold_seconds = self.rng.choice([0.3, 30.0])
        self.delivered: Counter[tuple[str, str]] = Counter()
        self.delivery_log: list[tuple[str, str, datetime]] = []
        self.powered_off: list[tuple[str, datetime, list[str]]] = []
        self.checkpoint_seconds = checkpoint_seconds

    # -- fault machinery ---------------------------------------------------------------
    def _maybe_fault(self, deadline_hint: float) -> Outcome | None:
        f, roll = self.faults, self.rng.random()
        if roll < f.crash_before:
            raise SimulatedCrash("crash before the adapter call")
        roll = self.rng.random()
        if roll < f.exception:
            raise RuntimeError("adapter exploded")
        roll -= f.exception
        if roll < f.hang:
            # Does its work, but answers after the caller stopped waiting.
            self.clock.sleep(deadline_hint + HANG_OVERSHOOT)
            return None
        roll -= f.hang
        if roll < f.failed:
            return Outcome(OutcomeStatus.FAILED, "injected failure")
        roll -= f.failed
        if roll < f.node_vanish and self.nodes:
            node = self.rng.choice(sorted(self.nodes))
            self._vanish(node)
        return None

    def _maybe_crash_after(self) -> None:
        if self.rng.random() < self.faults.crash_after:
            raise SimulatedCrash("crash after the adapter acted")

    def _vanish(self, node_id: str) -> None:
        self.vanished.add(node_id)
        for task in self.tasks.values():
            if task.info.node_id == node_id:
                self._die(task)

    def _deliver(self, task_id: str, op: str) -> None:
        self.delivered[(task_id, op)] += 1
        self.delivery_log.append((task_id, op, self.clock.now()))

    def _die(self, task: FakeTask) -> None:
        if task.alive:
            task.alive = False
            task.died_at = self.clock.now()

    def _task(self, task_id: str) -> FakeTask | None:
        task = self.tasks.get(task_id)
        if task is None or task.info.node_id in self.vanished or not task.alive:
            return None
        return task

    # -- inventory -----------------------------------------------------------------------
    def now(self) -> datetime:
        return self.clock.now()

    def list_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.node_id not in self.vanished]

    def list_gpus(self) -> list[GpuInfo]:
        return []

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        return empty_samples()

    def list_tasks(self) -> list[TaskInfo]:
        fault = self._maybe_fault(CALL_MARGIN)
        if fault is not None and fault.status is OutcomeStatus.FAILED:
            raise RuntimeError("list_tasks failed")
        return [t.info for t in self.tasks.values() if t.alive and t.info.node_id not in self.vanished]

    def read_task_events(self, start: datetime, end: datetime) -> pl.DataFrame:
        return empty_task_events()

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        return [self.tasks[t].info for t in task_ids if t in self.tasks]

    # -- drain operations ------------------------------------------------------------------
    def warn_task(self, task_id: str, deadline_seconds: float) -> Outcome:
        fault = self._maybe_fault(CALL_MARGIN)
        if fault:
            return fault
        task = self._task(task_id)
        if task is None:
            return Outcome(OutcomeStatus.GONE, "not running")
        self._deliver(task_id, "warn")
        if task.behaviour == "exits_during_notice":
            self._die(task)  # wraps up by itself as soon as it is warned
        self._maybe_crash_after()
        return Outcome.success("warned")

    def checkpoint_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        fault = self._maybe_fault(timeout_seconds + CALL_MARGIN)
        if fault:
            return fault
        task = self._task(task_id)
        if task is None:
            return Outcome(OutcomeStatus.GONE, "not running")
        self._deliver(task_id, "checkpoint")
        if task.behaviour == "crashes_mid_drain":
            self._die(task)
            self._maybe_crash_after()
            return Outcome(OutcomeStatus.GONE, "exited during checkpoint")
        if task.behaviour == "slow_checkpoint":
            self.clock.sleep(timeout_seconds)
            self._maybe_crash_after()
            return Outcome(OutcomeStatus.TIMEOUT, "no checkpoint in time")
        self.clock.sleep(min(self.checkpoint_seconds, timeout_seconds))
        self._maybe_crash_after()
        return Outcome.success("checkpointed")

    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        fault = self._maybe_fault(timeout_seconds + CALL_MARGIN)
        if fault:
            return fault
        task = self._task(task_id)
        if task is None:
            return Outcome(OutcomeStatus.GONE, "not running")
        self._deliver(task_id, "terminate")
        if task.behaviour == "ignores_sigterm":
            self.clock.sleep(timeout_seconds)
            self._maybe_crash_after()
            return Outcome(OutcomeStatus.TIMEOUT, "ignored SIGTERM")
        self.clock.sleep(0.1)
        self._die(task)
        self._maybe_crash_after()
        return Outcome.success("exited")

    def kill_task(self, task_id: str) -> Outcome:
        fault = self._maybe_fault(CALL_MARGIN)
        if fault:
            return fault
        task = self._task(task_id)
        if task is None:
            return Outcome(OutcomeStatus.GONE, "not running")
        self._deliver(task_id, "kill")
        self._die(task)
        self._maybe_crash_after()
        return Outcome.success("killed")

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        fault = self._maybe_fault(CALL_MARGIN)
        if fault:
            return fault
        for task in self.tasks.values():
            if set(gpu_uuids) & set(task.info.gpu_uuids) and task_id in (None, task.info.task_id):
                if task.info.node_id in self.vanished:
                    return Outcome(OutcomeStatus.GONE, "node vanished")
                if task.alive or task.gpu_free_at > self.clock.now():
                    return Outcome(OutcomeStatus.FAILED, f"held by {task.info.task_id}")
        return Outcome.success("free")

    def cordon(self, node_id: str) -> Outcome:
        return Outcome.success()

    def uncordon(self, node_id: str) -> Outcome:
        return Outcome.success()

    def power_on(self, node_id: str) -> Outcome:
        return Outcome.success()

    def power_off(self, node_id: str) -> Outcome:
        alive = sorted(t.info.task_id for t in self.tasks.values() if t.alive and t.info.node_id == node_id)
        self.powered_off.append((node_id, self.clock.now(), alive))
        return Outcome.success()


@dataclass
class CrashingStore:
    """An in-memory audit store whose appends sometimes crash the run (before or after)."""

    rng: random.Random
    crash_before: float = 0.0
    crash_after: float = 0.0
    inner: InMemoryAuditStore = field(default_factory=InMemoryAuditStore)

    def load_states(self, drain_id: str) -> list[DrainTransition]:
        return self.inner.load_states(drain_id)

    def append(self, transition: DrainTransition) -> None:
        if self.rng.random() < self.crash_before:
            raise SimulatedCrash("crash before the audit write")
        self.inner.append(transition)
        if self.rng.random() < self.crash_after:
            raise SimulatedCrash("crash after the audit write")

    def open_drain_ids(self, task_id: str) -> list[str]:
        return self.inner.open_drain_ids(task_id)


def node(node_id: str, pool: str = "p1", gpus: int = 8) -> NodeInfo:
    return NodeInfo(node_id, pool, "A100-80GB", "z1", gpus, NodeState.ON)


def samples_for(util_by_task: dict[str, float], minutes=6) -> pl.DataFrame:
    """Per-minute SM utilisation samples up to T0, one GPU per task."""
    rows = []
    for task_id, util in util_by_task.items():
        for m in range(minutes + 1):
            rows.append(
                {
                    "ts": T0 - timedelta(minutes=m),
                    "sm_util_pct": util,
                    "task_id": task_id,
                    "node_id": "n1",
                    "gpu_uuid": f"g-{task_id}",
                }
            )
    return pl.DataFrame(
        rows,
        schema={
            "ts": pl.Datetime("us", "UTC"),
            "sm_util_pct": pl.Float64,
            "task_id": pl.Utf8,
            "node_id": pl.Utf8,
            "gpu_uuid": pl.Utf8,
        },
    )


def assert_nothing_delivered(adapter: FakeFleetAdapter) -> None:
    """The adapter delivered no signal to any task (what was delivered, if it did)."""
    delivered = {key: n for key, n in adapter.delivered.items() if n}
    assert not delivered, f"signals delivered: {delivered}"
