"""Starting and adopting the tasks of the `local-process` backend (`LocalProcessAdapter`'s
first concern; the adapter itself reads, signals and accounts for them).

A launched task is the shipped toy worker holding GPU slots; an adopted task is any running
process (and the processes it started), registered by pid. Both are recorded in the task
registry under its lock, so a drain lease covers one task id per process.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

from market_pipeline.hardware.local_process import processes as osp
from market_pipeline.hardware.local_process.gpus import free_gpus, nvml_compute_pids
from market_pipeline.hardware.local_process.registry import (
    add_event,
    iso,
    new_record,
    prune_ended,
    root_created,
)
from market_pipeline.hardware.process_tree import (
    create_time,
    open_process,
    running,
)
from market_pipeline.hardware.protocol import (
    ResourceClass,
    TaskInfo,
    TaskKind,
)
from market_pipeline.workers.options import WORKER_MODULE, WorkerOptions

RETENTION = timedelta(days=7)  # ended tasks stay readable for metering this long


class LocalTaskStarter:
    """launch_task and adopt_pid, mixed into LocalProcessAdapter: they use its registry,
    workdir, GPU slots, child processes and task rows."""

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
