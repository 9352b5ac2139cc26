"""The `simulated` backend: the NodeAdapter protocol over a persisted digital twin.

State lives at `config.adapter.state_path` (JSON) with Parquet buffers next to it; every
call takes a file lock, reloads if another process moved the twin on, and commits what it
changed. `read_samples` / `read_task_events` advance the twin to the window's end when it
is behind; windows still in the sample buffer (48 h by default) re-read identically; older ones raise
SampleWindowExpired. Operations act at the twin's clock and answer with an Outcome; an
unknown node, task or GPU is GONE.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet import operations as ops
from market_pipeline.fleet.setup import FleetSetup, build_setup, default_epoch
from market_pipeline.fleet.state import check_identity, expected_identity, twin_from_state, twin_to_state
from market_pipeline.fleet.store import TwinStore, configured_blobs
from market_pipeline.fleet.twin import FleetTwin, TwinParams
from market_pipeline.fleet.workload import WorkloadParams
from market_pipeline.hardware.protocol import (
    PENDING_FIELDS,
    GpuInfo,
    NodeInfo,
    Outcome,
    OutcomeStatus,
    ResourceClass,
    TaskInfo,
    TaskKind,
    WaitingTask,
    empty_samples,
)

MAX_ADVANCE_S = 62 * 86_400  # one call may not simulate more than two months


class SampleWindowExpired(ValueError):
    """The requested sample window is older than the twin's sample buffer."""


def _seconds(moment: datetime, name: str) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {moment.isoformat()}")
    return math.ceil(moment.timestamp())


def _datetime(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class SimulatedAdapter:
    backend = "simulated"

    def __init__(
        self,
        config: MarketPipelineConfig,
        state_path: Path | None = None,
        *,
        epoch: datetime | None = None,
        policy: str | None = None,
        params: TwinParams | None = None,
        workload_params: WorkloadParams | None = None,
        sample_buffer_hours: float = 48.0,
    ) -> None:
        self.config = config
        self.setup: FleetSetup = build_setup(config, params, workload_params)
        self.policy_name = policy or config.adapter.placement_policy
        self.epoch = epoch or config.adapter.sim_epoch
        path = state_path or config.resolve_path(config.adapter.state_path)
        self.store = TwinStore(
            path, int(sample_buffer_hours * 3600), blobs=None if state_path else configured_blobs(config)
        )
        self.timeout = config.adapter.operation_timeout_seconds
        self._twin: FleetTwin | None = None
        self._generation = -1
        self._held = False  # inside batch(): the lock is held, commits wait for a checkpoint
        self._dirty = False

    @classmethod
    def from_config(cls, config: MarketPipelineConfig, **overrides: Any) -> "SimulatedAdapter":
        return cls(config, **overrides)

    # -- state --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self.store.blobs.lock(self.timeout):
            yield

    def _load(self) -> FleetTwin:
        """The current twin (caller holds the lock): create it on first use, reload it when
        another process committed since we last looked."""
        if self._twin is not None and self.store.peek_generation() == self._generation:
            return self._twin
        state = self.store.read_state()
        if state is None:
            epoch_ts = _seconds(self.epoch, "sim_epoch") if self.epoch else default_epoch()
            self._twin = self.setup.new_twin(epoch_ts, self.policy_name)
            self._generation = 0
            self._commit()
            return self._twin
        if self._twin is None or int(state["generation"]) != self._generation:
            where = self.store.where
            check_identity(state, expected_identity(self.setup, self.policy_name), where)
            if self.epoch and _seconds(self.epoch, "sim_epoch") != int(state["epoch_ts"]):
                raise ValueError(
                    f"{where}: stored epoch {_datetime(int(state['epoch_ts'])).isoformat()} "
                    f"differs from the requested {self.epoch.isoformat()}"
                )
            self._twin = twin_from_state(
                state,
                self.setup.catalog,
                self.setup.workload,
                self.setup.policy(self.policy_name),
                self.setup.params,
                where,
            )
            self._generation = int(state["generation"])
        return self._twin

    def _commit(self) -> None:
        twin = self._twin
        assert twin is not None
        samples, events, ended = twin.take_outputs()
        self._generation += 1
        self.store.commit(
            twin_to_state(twin, self.setup.workload_source, self._generation), samples, events, ended
        )

    @staticmethod
    def _advance(twin: FleetTwin, until_ts: int) -> None:
        if until_ts - twin.clock > MAX_ADVANCE_S:
            raise ValueError(
                f"refusing to simulate {(until_ts - twin.clock) / 86_400:.0f} days in one call "
                f"(from {_datetime(twin.clock).isoformat()} to {_datetime(until_ts).isoformat()}); "
                "advance in steps or start a fresh state"
            )
        twin.advance(until_ts)

    @contextlib.contextmanager
    def batch(self) -> Iterator[Callable[[], None]]:
        """Operations inside run under one lock and write the fleet state at checkpoints (the
        callable yielded) and at the end, not after each one: a batch of 176 scaling actions on
        a 4,278-node fleet wrote its 5 MB state 176 times. Callers checkpoint before they
        record outcomes elsewhere, so what they record has been committed here first."""
        if self._held:
            yield self._checkpoint
            return
        with self._locked():
            self._load()
            self._held, self._dirty = True, False
            try:
                yield self._checkpoint
            finally:
                self._held = False
                self._checkpoint()

    def _checkpoint(self) -> None:
        if self._dirty and self._twin is not None:
            self._commit()
        self._dirty = False

    def _with_twin(self, action: Callable[[FleetTwin], Any], mutate: bool) -> Any:
        if self._held:
            assert self._twin is not None
            result = action(self._twin)
            self._dirty = self._dirty or mutate
            return result
        with self._locked():
            twin = self._load()
            try:
                result = action(twin)
                if mutate:
                    self._commit()
            except BaseException:
                self._twin = None  # half-applied changes must not leak: reload from disk next time
                raise
            return result

    def _operation(self, action: Callable[[FleetTwin], Outcome]) -> Outcome:
        started = time.monotonic()
        try:
            outcome = self._with_twin(action, mutate=True)
        except TimeoutError as exc:
            return Outcome(OutcomeStatus.TIMEOUT, str(exc), time.monotonic() - started)
        except Exception as exc:  # an adapter bug is an outcome too, never a crash of the caller
            return Outcome(OutcomeStatus.FAILED, f"{type(exc).__name__}: {exc}", time.monotonic() - started)
        return outcome

    # -- clock ----------------------------------------------------------------------------------
    def now(self) -> datetime:
        return _datetime(self._with_twin(lambda t: t.clock, mutate=False))

    def epoch_time(self) -> datetime:
        return _datetime(self._with_twin(lambda t: t.epoch_ts, mutate=False))

    def advance(self, until: datetime) -> datetime:
        """Move the fleet forward to `until` (no-op if already there); returns the clock."""
        until_ts = _seconds(until, "until")

        def run(twin: FleetTwin) -> int:
            self._advance(twin, until_ts)
            return twin.clock

        return _datetime(self._with_twin(run, mutate=True))

    # -- inventory ------------------------------------------------------------------------------
    def list_nodes(self) -> list[NodeInfo]:
        def build(twin: FleetTwin) -> list[NodeInfo]:
            return [
                NodeInfo(
                    n.node_id,
                    n.pool_id,
                    n.gpu_model,
                    n.zone,
                    n.gpus,
                    twin.node_state[row],
                    bool(twin.cordoned[row]),
                    twin.catalog.models[n.gpu_model].nvlink,
                )
                for row, n in enumerate(twin.catalog.nodes)
            ]

        return self._with_twin(build, mutate=False)

    def list_gpus(self) -> list[GpuInfo]:
        def build(twin: FleetTwin) -> list[GpuInfo]:
            return [
                replace(info, mig_profile=twin.load.mig[i]) for i, info in enumerate(twin.catalog.gpu_infos())
            ]

        return self._with_twin(build, mutate=False)

    # -- telemetry and tasks --------------------------------------------------------------------
    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        start_ts, end_ts = _seconds(start, "start"), _seconds(end, "end")
        if end_ts <= start_ts:
            return empty_samples()

        def read(twin: FleetTwin) -> pl.DataFrame:
            retained = self.store.retained_from(twin.epoch_ts, max(twin.clock, end_ts))
            if start_ts < retained and end_ts > twin.epoch_ts:
                raise SampleWindowExpired(
                    f"samples before {_datetime(retained).isoformat()} are no longer buffered "
                    f"(asked from {_datetime(start_ts).isoformat()}); the buffer keeps "
                    f"{self.store.sample_retention_s / 3600:g} h"
                )
            if twin.clock < end_ts:
                self._advance(twin, end_ts)
                self._commit()
            return self.store.read_samples(start_ts, end_ts, twin.epoch_ts, self._generation)

        return self._with_twin(read, mutate=False)

    def read_task_events(self, start: datetime, end: datetime) -> pl.DataFrame:
        start_ts, end_ts = _seconds(start, "start"), _seconds(end, "end")

        def read(twin: FleetTwin) -> pl.DataFrame:
            if twin.clock < end_ts:
                self._advance(twin, end_ts)
                self._commit()
            return self.store.read_events(start_ts, end_ts, self._generation)

        return self._with_twin(read, mutate=False)

    def list_tasks(self) -> list[TaskInfo]:
        def build(twin: FleetTwin) -> list[TaskInfo]:
            return [
                _task_info(task_id, twin.task_record(task)) for task_id, task in sorted(twin.running.items())
            ]

        return self._with_twin(build, mutate=False)

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """Running or ended (within 7 days) tasks, in the order asked; unknown ids are left out."""

        def build(twin: FleetTwin) -> list[TaskInfo]:
            found = {tid: twin.task_record(twin.running[tid]) for tid in task_ids if tid in twin.running}
            missing = [tid for tid in task_ids if tid not in found]
            for record in self.store.read_ended(missing, self._generation):
                found.setdefault(record["task_id"], record)
            for record in twin.new_ended:
                found.setdefault(record["task_id"], record)
            return [_task_info(tid, found[tid]) for tid in dict.fromkeys(task_ids) if tid in found]

        return self._with_twin(build, mutate=False)

    def pending_summary(self) -> dict[str, dict[str, float]]:
        """Jobs waiting for capacity, per GPU model: count and GPUs asked (demand not served);
        for the rigid guarantee also the guaranteed jobs waiting, the GPUs they ask, the
        longest such wait (seconds) and the GPUs drainable tasks hold on that model."""

        def build(twin: FleetTwin) -> dict[str, dict[str, float]]:
            out: dict[str, dict[str, float]] = {}

            def row(model: str) -> dict[str, float]:
                return out.setdefault(model, dict.fromkeys(PENDING_FIELDS, 0.0))

            for job in twin.pending:
                r = row(job.gpu_model)
                r["jobs"] += 1
                r["gpus"] += job.num_gpu * job.gpu_milli / 1000
                if job.resource_class == "guaranteed":
                    r["guaranteed_jobs"] += 1
                    r["guaranteed_gpus"] += job.num_gpu * job.gpu_milli / 1000
                    r["guaranteed_oldest_wait_s"] = max(
                        r["guaranteed_oldest_wait_s"], twin.clock - job.arrival_ts
                    )
            for task in twin.running.values():
                if task.job.resource_class == "drainable" and task.job.gpu_model in out:
                    out[task.job.gpu_model]["drainable_running_gpus"] += (
                        task.job.num_gpu * task.job.gpu_milli / 1000
                    )
            return out

        return self._with_twin(build, mutate=False)

    def waiting_guaranteed(self, limit: int = 64) -> list[WaitingTask]:
        """The pending guaranteed jobs, oldest first (at most `limit`): what the drain
        planner makes room for (`drain.triggers.GuaranteedWaiting`)."""

        def build(twin: FleetTwin) -> list[WaitingTask]:
            rigid = [job for job in twin.pending if job.resource_class == ResourceClass.GUARANTEED.value]
            rigid.sort(key=lambda job: (job.arrival_ts, job.task_id))
            return [
                WaitingTask(
                    task_id=job.task_id,
                    tenant_id=job.tenant_id,
                    gpu_model=job.gpu_model,
                    num_gpu=job.num_gpu,
                    gpu_milli=job.gpu_milli,
                    mem_mib=job.mem_mib,
                    cpu_milli=job.cpu_milli,
                    waiting_since=_datetime(job.arrival_ts),
                )
                for job in rigid[: max(limit, 0)]
            ]

        return self._with_twin(build, mutate=False)

    def stats(self) -> dict[str, int]:
        return self._with_twin(lambda t: dict(t.stats), mutate=False)

    # -- operations -----------------------------------------------------------------------------
    def warn_task(self, task_id: str, deadline_seconds: float) -> Outcome:
        return self._operation(lambda t: ops.warn(t, task_id, deadline_seconds))

    def checkpoint_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        return self._operation(lambda t: ops.checkpoint(t, task_id, timeout_seconds))

    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        return self._operation(lambda t: ops.terminate(t, task_id, timeout_seconds))

    def kill_task(self, task_id: str) -> Outcome:
        return self._operation(lambda t: ops.kill(t, task_id))

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        return self._operation(lambda t: ops.verify_released(t, gpu_uuids, task_id))

    def requeue_task(self, task_id: str) -> Outcome:
        """A drained checkpointable task runs again as a new run (`<id>~r2`), from its checkpoint."""
        return self._operation(lambda t: ops.requeue(t, task_id))

    def cordon(self, node_id: str) -> Outcome:
        return self._operation(lambda t: ops.set_cordon(t, node_id, True))

    def uncordon(self, node_id: str) -> Outcome:
        return self._operation(lambda t: ops.set_cordon(t, node_id, False))

    def power_on(self, node_id: str) -> Outcome:
        return self._operation(lambda t: ops.power_on(t, node_id))

    def power_off(self, node_id: str) -> Outcome:
        return self._operation(lambda t: ops.power_off(t, node_id))

    # -- admission ------------------------------------------------------------------------------
    def set_refused_tenants(self, refused: Mapping[str, str]) -> Outcome:
        """Replace the set of tenants whose new tasks are refused (tenant -> why); their
        running tasks are left to the drain guardrail."""
        wanted = {str(k): str(v) for k, v in refused.items()}

        def apply(twin: FleetTwin) -> Outcome:
            twin.refused_tenants = wanted
            return Outcome.success(f"{len(wanted)} tenant(s) refused new tasks")

        return self._operation(apply)


def _task_info(task_id: str, record: dict[str, Any]) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tenant_id=record["tenant_id"],
        pool_id=record["pool_id"],
        node_id=record["node_id"],
        gpu_uuids=tuple(record["gpu_uuids"]),
        gpu_milli=int(record["gpu_milli"]),
        kind=TaskKind(record["kind"]),
        qos=record["qos"],
        priority=int(record["priority"]),
        resource_class=ResourceClass(record["resource_class"]),
        started_at=_datetime(int(record["started_ts"])),
        mem_mib=int(record["mem_mib"]),
        mig_profile=record["mig_profile"],
        do_not_drain=bool(record["do_not_drain"]),
        checkpointable=bool(record["checkpointable"]),
    )
