"""The node hardware adapter protocol: the only door to nodes, GPUs and processes.

Every operation is bounded by a timeout and returns a typed `Outcome`; an expected
failure (node gone, process gone, timeout, no driver) is an outcome, never an exception
past the adapter.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol, TypeVar, runtime_checkable

import polars as pl

# Canonical telemetry sample schema (README "Telemetry schema"). ts is UTC.
SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Datetime("us", "UTC"),
    "node_id": pl.Utf8,
    "gpu_uuid": pl.Utf8,
    "gpu_index": pl.Int32,
    "sm_util_pct": pl.Float64,
    "mem_used_mib": pl.Float64,
    "mem_total_mib": pl.Float64,
    "power_w": pl.Float64,
    "temp_c": pl.Float64,
    "mig_profile": pl.Utf8,
    "task_id": pl.Utf8,
    "tenant_id": pl.Utf8,
    "xid_errors": pl.Int32,
}
REQUIRED_SAMPLE_COLUMNS: tuple[str, ...] = (
    "ts",
    "node_id",
    "gpu_uuid",
    "gpu_index",
    "sm_util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "temp_c",
)


# Fields a backend may be unable to measure. A backend that cannot says so in its
# `unmeasured_sample_fields` and leaves them null ("not reported"); validation then lets
# exactly those nulls through for its samples. Every other backend must report them, and a
# null there is quarantined as `<field>:missing`. Keys, time, utilisation and total memory
# are never optional.
OPTIONAL_SAMPLE_FIELDS: frozenset[str] = frozenset({"mem_used_mib", "power_w", "temp_c"})


class SampleCapabilityError(ValueError):
    """A backend declares a sample field unmeasured that every backend must measure."""


def unmeasured_fields(adapter: object) -> frozenset[str]:
    """The sample fields `adapter` declares it cannot measure (empty: it measures them all)."""
    declared = frozenset(getattr(adapter, "unmeasured_sample_fields", frozenset()))
    wrong = sorted(declared - OPTIONAL_SAMPLE_FIELDS)
    if wrong:
        backend = getattr(adapter, "backend", type(adapter).__name__)
        raise SampleCapabilityError(
            f"{backend} adapter declares {', '.join(wrong)} unmeasured; only "
            f"{', '.join(sorted(OPTIONAL_SAMPLE_FIELDS))} may be"
        )
    return declared


def empty_samples() -> pl.DataFrame:
    return pl.DataFrame(schema=SAMPLE_SCHEMA)


# Task lifecycle events, the metering source: usage intervals open at `start` and close at
# `end` (normal exit), `drained` (after a drain) or `failed`; `drain_signal` marks the warning
# that starts a drain's billing grace period. `platform_fault` flags failures the platform caused.
TASK_EVENT_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Datetime("us", "UTC"),
    "task_id": pl.Utf8,
    "event": pl.Utf8,  # start | end | drain_signal | drained | failed
    "reason": pl.Utf8,
    "platform_fault": pl.Boolean,
}


def empty_task_events() -> pl.DataFrame:
    return pl.DataFrame(schema=TASK_EVENT_SCHEMA)


class OutcomeStatus(str, enum.Enum):
    OK = "ok"
    GONE = "gone"  # node or process no longer exists
    TIMEOUT = "timeout"
    FAILED = "failed"  # the operation ran and failed
    UNSUPPORTED = "unsupported"  # this backend cannot do it
    NO_DEVICE = "no_device"  # no driver / no GPU found
    # the node is in a state the backend does not act on (down, failed, not responding): read
    # and reported, never touched; the action cannot be carried out there, like a node gone
    REFUSED = "refused"


@dataclass(frozen=True)
class Outcome:
    status: OutcomeStatus
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is OutcomeStatus.OK

    @classmethod
    def success(cls, detail: str = "", seconds: float = 0.0) -> "Outcome":
        return cls(OutcomeStatus.OK, detail, seconds)


class NodeState(str, enum.Enum):
    ON = "on"
    WARM = "warm"  # powered but outside the pool: joins in about a minute
    OFF = "off"  # cold: joins after provisioning


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    pool_id: str
    gpu_model: str
    zone: str
    gpus: int
    state: NodeState
    cordoned: bool = False
    nvlink: bool = False


@dataclass(frozen=True)
class GpuInfo:
    gpu_uuid: str
    node_id: str
    gpu_index: int
    gpu_model: str
    memory_total_mib: int
    mig_profile: str | None = None
    nvlink_peers: tuple[str, ...] = ()


class TaskKind(str, enum.Enum):
    TRAINING = "training"
    INFERENCE = "inference"


class ResourceClass(str, enum.Enum):
    GUARANTEED = "guaranteed"
    DRAINABLE = "drainable"


@dataclass(frozen=True)
class TaskInfo:
    task_id: str
    tenant_id: str
    pool_id: str
    node_id: str
    gpu_uuids: tuple[str, ...]
    gpu_milli: int  # per GPU: 1000 = a whole GPU; < 1000 a fractional share or MIG slice
    kind: TaskKind
    qos: str  # LS | BE | Burstable | Guaranteed (openb vocabulary)
    priority: int  # lower drains first
    resource_class: ResourceClass
    started_at: datetime
    mem_mib: int = 0
    mig_profile: str | None = None
    do_not_drain: bool = False
    checkpointable: bool = True
    pid: int | None = None

    @property
    def gpus(self) -> float:
        return len(self.gpu_uuids) * self.gpu_milli / 1000.0


# The row a backend with a queue reports per GPU model (`pending_summary`): jobs waiting and
# the GPUs they ask; of them the guaranteed ones, their GPUs and the longest wait (seconds);
# the GPUs drainable tasks hold on that model (what drains could free for them).
PENDING_FIELDS = (
    "jobs",
    "gpus",
    "guaranteed_jobs",
    "guaranteed_gpus",
    "guaranteed_oldest_wait_s",
    "drainable_running_gpus",
)


@dataclass(frozen=True)
class WaitingTask:
    """A guaranteed (rigid) task waiting for capacity: what the drain planner makes room for
    (`drain.triggers.GuaranteedWaiting`). `gpu_milli` is per GPU, as in TaskInfo."""

    task_id: str
    tenant_id: str
    gpu_model: str
    num_gpu: int
    gpu_milli: int
    mem_mib: int
    waiting_since: datetime
    cpu_milli: int = 0

    def __post_init__(self) -> None:
        if (
            self.num_gpu < 1
            or not 0 < self.gpu_milli <= 1000
            or (self.num_gpu > 1 and self.gpu_milli != 1000)
        ):
            raise ValueError(
                f"waiting task {self.task_id}: {self.num_gpu} GPU(s) of {self.gpu_milli} milli is no request "
                "(one GPU of 1..1000 milli, or whole GPUs)"
            )


@dataclass(frozen=True)
class DrainableClosure:
    """One pass of rule 4 of the rigid guarantee on a backend with a queue of its own (Slurm):
    the GPU models closed to drainable work because guaranteed work waits there, the pending
    drainable jobs kept from starting on them (deferred, or their deferral renewed) and those
    let go again where their model opened. In shadow mode nothing is acted on and `deferred`
    lists what would have been."""

    closed_models: tuple[str, ...] = ()
    deferred: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # "<job id>: <why>" for each job the backend refused


@dataclass(frozen=True)
class GuaranteedArrival:
    """One guaranteed job's arrival as a backend with a queue of its own saw it (Slurm): when
    it came, the GPU model it asks for ("" where it names none) and the whole GPUs it asks on
    each of its `nodes` nodes. What rule 5's forecast of the guaranteed arrivals reads."""

    job_id: str
    arrived_at: datetime
    gpu_model: str
    num_gpu: int
    nodes: int = 1


@dataclass(frozen=True)
class DrainableKeptOff:
    """One pass of rules 5 and 6 of the rigid guarantee on a backend that starts work itself
    (Slurm): the nodes kept from new drainable work for the guaranteed arrivals to come (the
    room the forecast arrivals take, the empty largest nodes kept for whole-node work and
    those refilling them), those given back
    to drainable work this pass, and why nothing was applied where nothing could be (`refused`:
    one line). In shadow mode nothing is applied and `kept` lists what would have been."""

    kept: tuple[str, ...] = ()
    returned: tuple[str, ...] = ()
    refused: str = ""


@runtime_checkable
class NodeAdapter(Protocol):
    """What the control loop may do to the fleet; backends: simulated, local-process, nvml, dcgm."""

    backend: str

    def list_nodes(self) -> list[NodeInfo]: ...

    def list_gpus(self) -> list[GpuInfo]: ...

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        """Samples with ts in [start, end), in the canonical schema."""
        ...

    def list_tasks(self) -> list[TaskInfo]:
        """Tasks running now (for the simulated backend: at the fleet's simulated clock)."""
        ...

    def read_task_events(self, start: datetime, end: datetime) -> pl.DataFrame:
        """Task lifecycle events with ts in [start, end), TASK_EVENT_SCHEMA."""
        ...

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """Attributes of tasks by id, running or ended (for metering ended tasks)."""
        ...

    def warn_task(self, task_id: str, deadline_seconds: float) -> Outcome: ...

    def checkpoint_task(self, task_id: str, timeout_seconds: float) -> Outcome: ...

    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        """SIGTERM (or equivalent) and wait up to the timeout for the task to exit."""
        ...

    def kill_task(self, task_id: str) -> Outcome: ...

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        """With `task_id`: that task holds none of the GPUs any more (tenants may share a
        fractional GPU); without: nothing at all runs on them."""
        ...

    def cordon(self, node_id: str) -> Outcome: ...

    def uncordon(self, node_id: str) -> Outcome: ...

    def power_on(self, node_id: str) -> Outcome: ...

    def power_off(self, node_id: str) -> Outcome: ...


T = TypeVar("T")


def adapter_now(adapter: object) -> datetime:
    """The adapter's clock: the simulated fleet's clock, or UTC wall-clock time for real hosts."""
    clock = getattr(adapter, "now", None)
    if callable(clock):
        return clock()
    return datetime.now(timezone.utc)
