"""`local-process` backend: tasks are real OS processes on this machine.

Drains send real signals (SIGUSR1 warning, SIGUSR2 checkpoint request, SIGTERM, SIGKILL)
and checkpoints are real files. Tasks are started from the shipped worker program
(`market_pipeline.workers.toy_trainer`) or adopted by pid: a process that knows nothing of
the worker protocol only ever gets SIGTERM and SIGKILL (a warning or checkpoint signal is
sent only if the process has a handler for it, since their default action is to die).
SIGTERM and SIGKILL go to the task's whole process tree (`hardware.process_tree`: psutil, pinned
by create times), and a task has ended only when every process of it has.
GPUs are this machine's NVIDIA GPUs when NVML finds any, otherwise `gpus_per_node`
virtual slots of the first configured pool.

A launched task is the shipped toy worker holding GPU slots; an adopted task is any running
process (and the processes it started), registered by pid. Both are recorded in the task
registry under its lock, so a drain lease covers one task id per process.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from market_pipeline.hardware.local_process import processes as osp
from market_pipeline.hardware.local_process.gpus import free_gpus, nvml_compute_pids, nvml_gpus
from market_pipeline.hardware.local_process.registry import (
    TaskRegistry,
    add_event,
    exit_note,
    iso,
    mark_ended,
    new_record,
    prune_ended,
    root_created,
)
from market_pipeline.hardware.local_process.samples import read_task_samples, task_events_frame
from market_pipeline.hardware.process_tree import (
    ProcessTree,
    create_time,
    open_process,
    running,
    signal_and_wait,
    signal_tree,
    task_tree,
)
from market_pipeline.hardware.protocol import (
    GpuInfo,
    NodeInfo,
    NodeState,
    Outcome,
    OutcomeStatus,
    ResourceClass,
    TaskInfo,
    TaskKind,
)
from market_pipeline.workers.options import WORKER_MODULE, WorkerOptions

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

__all__ = ["LocalProcessAdapter", "WORKER_MODULE", "WorkerOptions"]

RETENTION = timedelta(days=7)  # ended tasks stay readable for metering this long
RESCAN_SECONDS = 1.0  # while its root runs, a task's tree is re-read at most this often


class LocalProcessAdapter:
    backend = "local-process"

    def __init__(
        self,
        registry_path: Path,
        workdir: Path,
        *,
        node_id: str,
        pool_id: str,
        gpu_model: str,
        zone: str,
        gpu_slots: int,
        default_memory_mib: int = 24576,
        operation_timeout_seconds: float = 10.0,
        poll_seconds: float = 0.02,
        use_nvml: bool = True,
    ) -> None:
        self.registry = TaskRegistry(registry_path, lock_timeout_seconds=operation_timeout_seconds)
        self.workdir = workdir
        self.node_id, self.pool_id, self.gpu_model, self.zone = node_id, pool_id, gpu_model, zone
        self.operation_timeout_seconds = operation_timeout_seconds
        self.poll_seconds = poll_seconds
        real = nvml_gpus() if use_nvml else []
        self._gpus = real or [(f"{node_id}-gpu-{i}", default_memory_mib) for i in range(gpu_slots)]
        self._children: dict[int, subprocess.Popen] = {}  # processes this object started
        self._scanned: dict[str, float] = {}  # task id -> when its tree was last read

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "LocalProcessAdapter":
        """Node, pool and GPU slots from the first configured pool; state next to state_path."""
        pool = config.pools[0]
        state = config.resolve_path(config.adapter.state_path)
        memory = config.gpu_model_by_name[pool.gpu_model].memory_mib
        return cls(
            state.with_name(state.stem + ".local_process.json"),
            state.parent / "local_tasks",
            node_id=f"local-{socket.gethostname()}",
            pool_id=pool.pool_id,
            gpu_model=pool.gpu_model,
            zone=pool.zone,
            gpu_slots=pool.gpus_per_node,
            default_memory_mib=memory,
            operation_timeout_seconds=config.adapter.operation_timeout_seconds,
        )

    # -- starting and adopting tasks ------------------------------------------------------
    def launch_task(
        self,
        *,
        task_id: str | None = None,
        tenant_id: str = "local",
        kind: TaskKind = TaskKind.TRAINING,
        priority: int = 0,
        gpus: int = 1,
        gpu_milli: int = 1000,
        qos: str = "BE",
        resource_class: ResourceClass = ResourceClass.DRAINABLE,
        do_not_drain: bool = False,
        mem_mib: int = 1024,
        options: WorkerOptions = WorkerOptions(),
    ) -> TaskInfo:
        """Start the toy worker as a task holding `gpus` GPU slots (`gpu_milli` of each)."""
        task_id = task_id or f"local-{uuid.uuid4().hex[:10]}"
        task_dir = self.workdir / task_id
        task_dir.mkdir(parents=True, exist_ok=True)
        checkpoint, metrics = task_dir / "checkpoint.json", task_dir / "metrics.jsonl"
        with self.registry.edit() as reg:
            if task_id in reg["tasks"] and reg["tasks"][task_id]["ended_at"] is None:
                raise ValueError(f"task_id {task_id!r} is already running")
            self._refresh(reg)
            prune_ended(reg, datetime.now(timezone.utc) - RETENTION)
            gpu_uuids = free_gpus(self._gpus, reg["tasks"].values(), gpus, gpu_milli, self.node_id)
            argv = [
                sys.executable,
                "-m",
                WORKER_MODULE,
                "--checkpoint",
                str(checkpoint),
                "--metrics",
                str(metrics),
                *options.argv(),
            ]
            with open(task_dir / "worker.log", "ab") as log:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
            self._children[proc.pid] = proc
            record = new_record(
                task_id,
                tenant_id,
                proc.pid,
                osp.proc_start_ticks(proc.pid),
                gpu_uuids,
                gpu_milli,
                kind.value,
                qos,
                priority,
                resource_class.value,
                do_not_drain,
                True,
                mem_mib,
                iso(datetime.now(timezone.utc)),
            )
            record.update(
                worker=True,
                checkpoint_path=str(checkpoint),
                metrics_path=str(metrics),
                create_time=create_time(proc.pid),
            )
            reg["tasks"][task_id] = record
            add_event(reg, task_id, "start", "launched")
        self._await_handlers(proc.pid)
        return self._task_info(record)

    def adopt_pid(
        self,
        pid: int,
        *,
        task_id: str | None = None,
        tenant_id: str = "external",
        kind: TaskKind = TaskKind.TRAINING,
        priority: int = 0,
    ) -> TaskInfo:
        """Register a running process (and the processes it started) as a task.

        A pid that names no process, PID 1, this process or an ancestor of it is refused
        (NoSuchProcessError / ProtectedProcessError) and nothing is registered."""
        proc = open_process(pid)
        created = proc.create_time()
        ticks = osp.proc_start_ticks(pid)
        task_id = task_id or f"pid-{pid}-{ticks if ticks is not None else int(created * 100)}"
        cmdline = osp.proc_cmdline(pid)
        checkpoint = None
        if WORKER_MODULE in cmdline and "--checkpoint" in cmdline[:-1]:
            checkpoint = cmdline[cmdline.index("--checkpoint") + 1]
        holders = nvml_compute_pids() or {}
        gpu_uuids = tuple(u for u, pids in holders.items() if pid in pids)
        started = osp.proc_started_at(pid) or datetime.now(timezone.utc)
        with self.registry.edit() as reg:
            # A process already registered (a launched worker) keeps its task: one task id
            # per process, so one drain lease covers it whichever way it is named.
            same = [
                r
                for r in reg["tasks"].values()
                if r["ended_at"] is None and r["pid"] == pid and running(pid, root_created(r))
            ]
            existing = same[0] if same else reg["tasks"].get(task_id)
            if existing is None:
                record = new_record(
                    task_id,
                    tenant_id,
                    pid,
                    ticks,
                    gpu_uuids,
                    1000,
                    kind.value,
                    "BE",
                    priority,
                    ResourceClass.DRAINABLE.value,
                    False,
                    checkpoint is not None,
                    0,
                    iso(started),
                )
                record.update(worker=checkpoint is not None, checkpoint_path=checkpoint, create_time=created)
                reg["tasks"][task_id] = record
                add_event(reg, task_id, "start", "adopted by pid", ts=started)
                existing = record
        return self._task_info(existing)

    def tasks_of_pid(self, pid: int) -> list[TaskInfo]:
        """Registered tasks (running or ended) whose root process had this pid, newest first."""
        records = [r for r in self.registry.read()["tasks"].values() if r["pid"] == pid]
        return [self._task_info(r) for r in sorted(records, key=lambda r: r["started_at"], reverse=True)]

    # -- inventory ----------------------------------------------------------------------------
    def list_nodes(self) -> list[NodeInfo]:
        cordoned = self.node_id in self.registry.read()["cordoned"]
        return [
            NodeInfo(
                self.node_id,
                self.pool_id,
                self.gpu_model,
                self.zone,
                len(self._gpus),
                NodeState.ON,
                cordoned=cordoned,
            )
        ]

    def list_gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(gpu_uuid, self.node_id, index, self.gpu_model, memory)
            for index, (gpu_uuid, memory) in enumerate(self._gpus)
        ]

    def list_tasks(self) -> list[TaskInfo]:
        with self.registry.edit() as reg:
            self._refresh(reg)
            live = [r for r in reg["tasks"].values() if r["ended_at"] is None]
        return [self._task_info(r) for r in sorted(live, key=lambda r: r["task_id"])]

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        tasks = self.registry.read()["tasks"]
        return [self._task_info(tasks[t]) for t in task_ids if t in tasks]

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        memory = dict(self._gpus)
        index = {gpu_uuid: i for i, (gpu_uuid, _) in enumerate(self._gpus)}
        return read_task_samples(
            self.registry.read()["tasks"].values(), start, end, self.node_id, memory, index
        )

    def read_task_events(self, start: datetime, end: datetime) -> pl.DataFrame:
        return task_events_frame(self.registry.read()["events"], start, end)

    # -- drain operations ---------------------------------------------------------------------
    def warn_task(self, task_id: str, deadline_seconds: float) -> Outcome:
        started = time.monotonic()
        with self.registry.edit() as reg:
            record = self._live(reg, task_id)
            if record is None:
                return Outcome(OutcomeStatus.GONE, f"task {task_id} is not running")
            record["drain_signal_at"] = iso(datetime.now(timezone.utc))
            add_event(reg, task_id, "drain_signal", f"drain in {deadline_seconds:.0f}s")
        if not self._handles(record, signal.SIGUSR1):
            return Outcome(
                OutcomeStatus.UNSUPPORTED,
                "process has no SIGUSR1 handler: notice recorded, not signalled",
                time.monotonic() - started,
            )
        return self._send_root(record, signal.SIGUSR1, "SIGUSR1 warning sent", started)

    def checkpoint_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        started = time.monotonic()
        record = self._live(self.registry.read(), task_id, refresh=True)
        if record is None:
            return Outcome(OutcomeStatus.GONE, f"task {task_id} is not running")
        path = record.get("checkpoint_path")
        if not path or not self._handles(record, signal.SIGUSR2):
            return Outcome(OutcomeStatus.UNSUPPORTED, "process has no checkpoint hook")
        checkpoint = Path(path)
        token = uuid.uuid4().hex
        checkpoint.with_name(checkpoint.name + ".request").write_text(token)
        sent = self._send_root(record, signal.SIGUSR2, "", started)
        if not sent.ok:
            return sent
        done = checkpoint.with_name(checkpoint.name + ".done")
        deadline = started + timeout_seconds
        while True:
            if self._ack_token(done) == token:
                return Outcome.success(f"checkpoint written to {checkpoint}", time.monotonic() - started)
            if not self._alive(record):
                return Outcome(
                    OutcomeStatus.GONE,
                    f"exited during checkpoint{exit_note(record)}",
                    time.monotonic() - started,
                )
            if time.monotonic() >= deadline:
                return Outcome(
                    OutcomeStatus.TIMEOUT,
                    f"no checkpoint within {timeout_seconds}s",
                    time.monotonic() - started,
                )
            time.sleep(self.poll_seconds)

    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        return self._signal_and_wait(task_id, signal.SIGTERM, timeout_seconds)

    def kill_task(self, task_id: str) -> Outcome:
        outcome = self._signal_and_wait(task_id, signal.SIGKILL, self.operation_timeout_seconds)
        if outcome.status is OutcomeStatus.TIMEOUT:
            return Outcome(OutcomeStatus.FAILED, "still alive after SIGKILL", outcome.seconds)
        return outcome

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        known = {gpu_uuid for gpu_uuid, _ in self._gpus}
        unknown = [g for g in gpu_uuids if g not in known]
        if unknown:
            return Outcome(OutcomeStatus.FAILED, f"unknown GPU(s) on {self.node_id}: {unknown}")
        with self.registry.edit() as reg:
            self._refresh(reg)
            tasks = list(reg["tasks"].values())
        for gpu_uuid in gpu_uuids:
            holders = [
                r["task_id"]
                for r in tasks
                if r["ended_at"] is None
                and gpu_uuid in r["gpu_uuids"]
                and (task_id is None or r["task_id"] == task_id)
            ]
            if holders:
                return Outcome(OutcomeStatus.FAILED, f"{gpu_uuid} still held by {holders}")
        compute = nvml_compute_pids()
        if compute is not None:
            ended = {r["pid"] for r in tasks if r["ended_at"] is not None}
            stuck = {g: sorted(compute.get(g, set()) & ended) for g in gpu_uuids}
            stuck = {g: pids for g, pids in stuck.items() if pids}
            if stuck:
                return Outcome(OutcomeStatus.FAILED, f"driver still lists ended pids: {stuck}")
        return Outcome.success(f"{len(gpu_uuids)} GPU(s) free")

    def cordon(self, node_id: str) -> Outcome:
        return self._set_cordon(node_id, True)

    def uncordon(self, node_id: str) -> Outcome:
        return self._set_cordon(node_id, False)

    def power_on(self, node_id: str) -> Outcome:
        if node_id != self.node_id:
            return Outcome(OutcomeStatus.GONE, f"unknown node {node_id}")
        return Outcome.success("this machine is on")

    def power_off(self, node_id: str) -> Outcome:
        if node_id != self.node_id:
            return Outcome(OutcomeStatus.GONE, f"unknown node {node_id}")
        return Outcome(OutcomeStatus.UNSUPPORTED, "local-process does not power off its host")

    # -- internals -------------------------------------------------------------------------
    def _task_info(self, r: dict[str, Any]) -> TaskInfo:
        return TaskInfo(
            task_id=r["task_id"],
            tenant_id=r["tenant_id"],
            pool_id=self.pool_id,
            node_id=self.node_id,
            gpu_uuids=tuple(r["gpu_uuids"]),
            gpu_milli=r["gpu_milli"],
            kind=TaskKind(r["kind"]),
            qos=r["qos"],
            priority=r["priority"],
            resource_class=ResourceClass(r["resource_class"]),
            started_at=datetime.fromisoformat(r["started_at"]),
            mem_mib=r["mem_mib"],
            do_not_drain=r["do_not_drain"],
            checkpointable=r["checkpointable"],
            pid=r["pid"],
        )

    def _await_handlers(self, pid: int, timeout: float = 10.0) -> None:
        """Wait until a fresh worker has installed its signal handlers (or died)."""
        deadline = time.monotonic() + timeout
        wanted = {signal.SIGUSR1, signal.SIGUSR2}
        while time.monotonic() < deadline and osp.process_alive(pid):
            if wanted <= osp.caught_signals(pid):
                return
            time.sleep(0.01)

    def _tree(self, record: dict[str, Any]) -> ProcessTree:
        """The task's live processes now; remembered in the record, so that children the
        root's death re-parented stay the task's (saved with the next registry edit)."""
        tree = task_tree(record["pid"], root_created(record), record.get("members") or ())
        record["members"] = [list(ref) for ref in tree.refs()]
        self._scanned[record["task_id"]] = time.monotonic()
        child = self._children.get(record["pid"])
        # After the scan: a root that exited during it is a zombie there, reaped here.
        if child is not None and child.poll() is not None:
            record["exit_code"] = child.returncode
        return tree

    def _alive(self, record: dict[str, Any]) -> bool:
        """Whether any process of the task runs: its root, a descendant or its group.
        A running root answers alone between rescans (a scan reads the process table)."""
        recent = time.monotonic() - self._scanned.get(record["task_id"], -RESCAN_SECONDS)
        child = self._children.get(record["pid"])
        root_runs = (
            child.poll() is None if child is not None else running(record["pid"], root_created(record))
        )
        if root_runs and recent < RESCAN_SECONDS:
            return True
        return self._tree(record).alive

    def _handles(self, record: dict[str, Any], sig: signal.Signals) -> bool:
        """Whether the process catches `sig` now (a worker still starting up does not yet)."""
        if osp.has_proc():
            return sig in osp.caught_signals(record["pid"])
        return bool(record.get("worker"))

    def _live(self, reg: dict[str, Any], task_id: str, refresh: bool = False) -> dict[str, Any] | None:
        record = reg["tasks"].get(task_id)
        if record is None or record["ended_at"] is not None:
            return None
        if not self._alive(record):
            if refresh:
                with self.registry.edit() as fresh:
                    self._refresh(fresh)
            else:
                mark_ended(reg, record, "exited", record.get("exit_code"))
            return None
        return record

    def _refresh(self, reg: dict[str, Any]) -> None:
        for record in reg["tasks"].values():
            if record["ended_at"] is None and not self._alive(record):
                mark_ended(reg, record, "exited", record.get("exit_code"))

    def _send_root(self, record: dict[str, Any], sig: signal.Signals, detail: str, started: float) -> Outcome:
        """A protocol signal (warning, checkpoint request) to the task's root process only:
        its children may not handle it, and its default action is to die."""
        root = [p for p in self._tree(record).members if p.pid == record["pid"]]
        sent, problems = signal_tree(ProcessTree(tuple(root)), sig)
        if problems:
            return Outcome(OutcomeStatus.FAILED, "; ".join(problems), time.monotonic() - started)
        if not sent:
            return Outcome(OutcomeStatus.GONE, "no such process", time.monotonic() - started)
        return Outcome.success(detail, time.monotonic() - started)

    def _signal_and_wait(self, task_id: str, sig: signal.Signals, timeout: float) -> Outcome:
        """`sig` once to every process of the task (the tree frozen first, and those found
        later), then wait until all of them are gone or `timeout` passes (`hardware.process_tree`)."""
        started = time.monotonic()
        record = self._live(self.registry.read(), task_id, refresh=True)
        if record is None:
            return Outcome(OutcomeStatus.GONE, f"task {task_id} is not running")
        self._tree(record)  # the members as of now, before anything is signalled
        result = signal_and_wait(
            record["pid"], root_created(record), record["members"], sig, timeout, self.poll_seconds
        )
        record["members"] = [list(ref) for ref in result.seen]
        self._tree(record)  # reaps a root this object started, for its exit code
        with self.registry.edit() as reg:
            stored = reg["tasks"][task_id]
            stored["members"] = record["members"]
            if result.gone and result.sent and stored["ended_at"] is None:
                mark_ended(reg, stored, f"exited after {sig.name}", record.get("exit_code"))
        seconds = time.monotonic() - started
        if result.problems and not result.sent:
            return Outcome(OutcomeStatus.FAILED, "; ".join(result.problems), seconds)
        if not result.gone:
            pids = [pid for pid, _ in result.left]
            return Outcome(
                OutcomeStatus.TIMEOUT,
                f"{len(pids)} process(es) {pids} alive {timeout}s after {sig.name}",
                seconds,
            )
        if not result.sent:
            return Outcome(OutcomeStatus.GONE, f"task {task_id} exited before {sig.name}", seconds)
        return Outcome.success(
            f"{len(result.sent)} process(es) exited after {sig.name}{exit_note(record)}", seconds
        )

    def _set_cordon(self, node_id: str, cordoned: bool) -> Outcome:
        if node_id != self.node_id:
            return Outcome(OutcomeStatus.GONE, f"unknown node {node_id}")
        with self.registry.edit() as reg:
            nodes = set(reg["cordoned"])
            nodes = nodes | {node_id} if cordoned else nodes - {node_id}
            reg["cordoned"] = sorted(nodes)
        return Outcome.success("cordoned" if cordoned else "uncordoned")

    @staticmethod
    def _ack_token(done: Path) -> str | None:
        try:
            return json.loads(done.read_text()).get("token")
        except (OSError, ValueError):
            return None
