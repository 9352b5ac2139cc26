"""The `nvml` backend: the GPUs of this host through pynvml (package nvidia-ml-py).

One adapter = one node (this host). It reads per-GPU and per-MIG-instance utilisation,
memory, power and temperature, ECC/XID health, compute processes and NVLink peers.
Without a driver or a GPU every read returns nothing and `probe()` says
"no NVIDIA driver/GPU found: ..."; nothing raises.

Tasks are the compute processes NVML lists. A process names its task and tenant through
its environment (MARKET_TASK_ID, MARKET_TENANT_ID) when this user may read it; otherwise
the task is "pid-<pid>" and the tenant the process owner. Drains act on those processes
(SIGTERM, then SIGKILL, through psutil to the process and its children, never to PID 1,
this process or an ancestor); warnings and checkpoints need a cooperating runtime and are
UNSUPPORTED here. Samples are point-in-time: `read_samples(start, end)` returns one
reading when now falls in [start, end). `xid_errors` counts critical XID events seen since
the previous reading (needs permission to register NVML events; null otherwise).
"""

from __future__ import annotations

import concurrent.futures
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from market_pipeline.hardware.naming import DeviceModelNamer, identity_namer, mig_gpu_milli
from market_pipeline.hardware.nvml.devices import (
    DeviceReading,
    NvmlReader,
    drain_xid_events,
    main_process,
    register_xid_events,
)
from market_pipeline.hardware.nvml.processes import ProcessIdentity, identify_process
from market_pipeline.hardware.nvml.snapshot import build_snapshot
from market_pipeline.hardware.process_tree import refusal, signal_and_wait
from market_pipeline.hardware.protocol import (
    SAMPLE_SCHEMA,
    GpuInfo,
    NodeInfo,
    Outcome,
    OutcomeStatus,
    TaskInfo,
    empty_samples,
)
from market_pipeline.hardware.readonly import ReadOnlyAdapter

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

NO_DEVICE_PREFIX = "no NVIDIA driver/GPU found"


class NvmlAdapter(ReadOnlyAdapter):
    """Reads this host and signals its GPU processes; nothing else (see the module doc)."""

    backend = "nvml"
    cannot_act_because = (
        "it sees one host's GPU processes: no scheduler, no power control, no channel to a task's runtime"
    )

    def __init__(
        self,
        nvml: Any | None = None,
        node_id: str | None = None,
        zone: str = "local",
        timeout_seconds: float = 10.0,
        proc_root: str = "/proc",
        clock: Callable[[], datetime] | None = None,
        gpm_interval_seconds: float = 0.1,
        model_namer: Callable[[str], str] = identity_namer,
    ) -> None:
        super().__init__(clock)
        self._nvml = nvml
        self._model_name = model_namer
        self.node_id = node_id or socket.gethostname()
        self.zone = zone
        self.timeout_seconds = timeout_seconds
        self.proc_root = proc_root
        self.gpm_interval_seconds = gpm_interval_seconds
        self._initialised = False
        self._init_error: str | None = None
        self._xid_events: Any = None
        self._xid_counts: Counter[str] = Counter()
        self.last_error: str | None = None
        self.unsupported: dict[str, str] = {}

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "NvmlAdapter":
        adapter = getattr(config, "adapter")
        return cls(
            zone=adapter.zone,
            timeout_seconds=float(adapter.operation_timeout_seconds),
            model_namer=DeviceModelNamer.from_config(config),
        )

    # -- library lifecycle -------------------------------------------------------------------
    def _library(self) -> Any | None:
        """The initialised NVML module, or None (reason in _init_error)."""
        if self._initialised:
            return self._nvml
        if self._init_error is not None:
            return None
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except ImportError as exc:
            self._init_error = f"{NO_DEVICE_PREFIX}: pynvml is not installed ({exc})"
            return None
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._init_error = f"{NO_DEVICE_PREFIX}: {type(exc).__name__}: {exc}"
            return None
        self._initialised = True
        self._xid_events, problem = register_xid_events(self._nvml)
        if problem is not None:
            self.unsupported["xid_events"] = problem
        return self._nvml

    def close(self) -> None:
        if self._initialised:
            try:
                if self._xid_events is not None:
                    self._nvml.nvmlEventSetFree(self._xid_events)
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._initialised = False

    # -- bounded reading -----------------------------------------------------------------------
    def _read(self) -> list[DeviceReading] | None:
        """All devices within the timeout (XID events are accumulated on the side);
        None when NVML is unavailable or stuck."""
        nvml = self._library()
        if nvml is None:
            self.last_error = self._init_error
            return None
        reader = NvmlReader(nvml, self.gpm_interval_seconds)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(lambda: (reader.read_devices(), drain_xid_events(nvml, self._xid_events)))
        try:
            devices, xids = future.result(timeout=self.timeout_seconds)
        except concurrent.futures.TimeoutError:
            self.last_error = f"NVML did not answer within {self.timeout_seconds}s"
            return None
        except nvml.NVMLError as exc:
            self.last_error = f"NVML error: {exc}"
            return None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        self.last_error = None
        self.unsupported.update(reader.unsupported)
        self._xid_counts.update(xids or {})  # a Counter: adds to what the next samples report
        return devices

    def _take_xid_counts(self) -> dict[str, int] | None:
        """XID events accumulated since the previous sample set (None: not observable)."""
        counts, self._xid_counts = dict(self._xid_counts), Counter()
        return None if self._xid_events is None else counts

    def probe(self) -> Outcome:
        started = time.monotonic()
        result = self._read()
        seconds = time.monotonic() - started
        if result is None:
            status = OutcomeStatus.NO_DEVICE if self._init_error else OutcomeStatus.FAILED
            return Outcome(status, self.last_error or "", seconds)
        gpus = [d for d in result if d.parent_uuid is None]
        if not gpus:
            return Outcome(OutcomeStatus.NO_DEVICE, f"{NO_DEVICE_PREFIX}: NVML lists 0 GPUs", seconds)
        mig = len(result) - len(gpus)
        return Outcome.success(f"{len(gpus)} GPU(s), {mig} MIG instance(s) on {self.node_id}", seconds)

    # -- protocol: reads -----------------------------------------------------------------------
    def _devices(self) -> list[DeviceReading]:
        return self._read() or []

    def list_nodes(self) -> list[NodeInfo]:
        gpus = [d for d in self._devices() if d.parent_uuid is None]
        if not gpus:
            return []
        model = self._model_name(gpus[0].name)
        return [self._node(self.node_id, model, len(gpus), any(g.nvlink_peers for g in gpus))]

    def list_gpus(self) -> list[GpuInfo]:
        devices = self._devices()
        names = {d.uuid: self._model_name(d.name) for d in devices if d.parent_uuid is None}
        return [
            GpuInfo(
                gpu_uuid=d.uuid,
                node_id=self.node_id,
                gpu_index=d.index,
                gpu_model=names.get(d.parent_uuid or d.uuid, self._model_name(d.name)),
                memory_total_mib=int(d.memory_total_mib or 0),
                mig_profile=d.mig_profile,
                nvlink_peers=d.nvlink_peers,
            )
            for d in devices
            if not d.mig_enabled
        ]

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        now = self.now()
        if not start <= now < end:
            return empty_samples()
        devices = self._read()
        if devices is None:
            return empty_samples()
        return self._samples(devices, self._take_xid_counts(), now)

    def _samples(
        self, devices: list[DeviceReading], xids: dict[str, int] | None, now: datetime
    ) -> pl.DataFrame:
        identities = self._identities(devices)
        rows = []
        for device in devices:
            if device.mig_enabled:
                continue  # its MIG instances are the sampled units
            owner = main_process(device)
            identity = identities.get(owner.pid) if owner else None
            xid_key = device.parent_uuid or device.uuid
            rows.append(
                {
                    "ts": now,
                    "node_id": self.node_id,
                    "gpu_uuid": device.uuid,
                    "gpu_index": device.index,
                    "sm_util_pct": device.sm_util_pct,
                    "mem_used_mib": device.memory_used_mib,
                    "mem_total_mib": device.memory_total_mib,
                    "power_w": device.power_w,
                    "temp_c": device.temp_c,
                    "mig_profile": device.mig_profile,
                    "task_id": identity.task_id if identity else None,
                    "tenant_id": identity.tenant_id if identity else None,
                    "xid_errors": None if xids is None else xids.get(xid_key, 0),
                }
            )
        return pl.DataFrame(rows, schema=SAMPLE_SCHEMA) if rows else empty_samples()

    def _identities(self, devices: list[DeviceReading]) -> dict[int, ProcessIdentity]:
        pids = {p.pid for d in devices for p in d.processes}
        return {pid: identify_process(pid, self.proc_root) for pid in pids}

    def list_tasks(self) -> list[TaskInfo]:
        devices = self._devices()
        identities = self._identities(devices)
        by_task: dict[str, dict] = {}
        models = {d.uuid: self._model_name(d.name) for d in devices if d.parent_uuid is None}
        for device in devices:
            for process in device.processes:
                identity = identities[process.pid]
                task = by_task.setdefault(
                    identity.task_id,
                    {
                        "identity": identity,
                        "pid": process.pid,
                        "gpus": [],
                        "mem": 0.0,
                        "mig": device.mig_profile,
                        "model": models.get(device.parent_uuid or device.uuid, self._model_name(device.name)),
                    },
                )
                if device.uuid not in task["gpus"]:
                    task["gpus"].append(device.uuid)
                task["mem"] += process.used_mib or 0.0
        return [
            self._task(
                task_id,
                t["identity"].tenant_id,
                t["model"],
                self.node_id,
                tuple(t["gpus"]),
                mig_gpu_milli(t["mig"]),
                t["identity"].started_at or self.now(),
                int(t["mem"]),
                t["mig"],
                pid=t["pid"],
            )
            for task_id, t in sorted(by_task.items())
        ]

    # -- protocol: acting (warnings, checkpoints, cordons and power: ReadOnlyAdapter) ----------
    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        return self._signal(task_id, signal.SIGTERM, timeout_seconds)

    def kill_task(self, task_id: str) -> Outcome:
        return self._signal(task_id, signal.SIGKILL, self.timeout_seconds)

    def _signal(self, task_id: str, signum: signal.Signals, wait_seconds: float) -> Outcome:
        """`signum` once to the GPU process and every process it started (psutil, pinned by
        the start time read with the NVML listing, so a recycled pid is never hit; the tree
        frozen first), then wait until all of them are gone (`hardware.process_tree`)."""
        started = time.monotonic()
        task = next((t for t in self.list_tasks() if t.task_id == task_id), None)
        if task is None or task.pid is None:
            return Outcome(OutcomeStatus.GONE, f"task {task_id} runs no GPU process here")
        reason = refusal(task.pid)
        if reason:
            return Outcome(OutcomeStatus.FAILED, f"process {task.pid}: {reason}; not signalled")
        result = signal_and_wait(task.pid, task.started_at.timestamp(), (), signum, wait_seconds)
        seconds = time.monotonic() - started
        if result.problems and not result.sent:
            return Outcome(
                OutcomeStatus.FAILED,
                f"cannot signal process {task.pid}: " + "; ".join(result.problems),
                seconds,
            )
        if not result.gone:
            return Outcome(
                OutcomeStatus.TIMEOUT,
                f"{len(result.left)} process(es) of {task.pid} still alive after {wait_seconds}s",
                seconds,
            )
        if not result.sent:
            return Outcome(OutcomeStatus.GONE, f"process {task.pid} is gone (or its pid reused)", seconds)
        return Outcome.success(f"process {task.pid} and {len(result.sent) - 1} child(ren) exited", seconds)

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        # NVML sees processes, not tasks: a GPU counts as released only when no process
        # runs on it, whichever task was drained.
        devices = {d.uuid: d for d in self._devices()}
        if not devices:
            return Outcome(
                OutcomeStatus.NO_DEVICE if self._init_error else OutcomeStatus.FAILED,
                self.last_error or "no GPU readable",
            )
        missing = [u for u in gpu_uuids if u not in devices]
        busy = [
            f"{u}: pids {[p.pid for p in devices[u].processes]}"
            for u in gpu_uuids
            if u in devices and devices[u].processes
        ]
        if busy:
            return Outcome(OutcomeStatus.FAILED, "still in use: " + "; ".join(busy))
        if missing:
            return Outcome(OutcomeStatus.GONE, "not on this host: " + ", ".join(missing))
        return Outcome.success(f"{len(gpu_uuids)} GPU(s) released")

    # -- operator view ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        """Everything this backend sees, for `telemetry probe --backend nvml`."""
        return build_snapshot(self)
