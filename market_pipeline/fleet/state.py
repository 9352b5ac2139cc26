"""Twin state <-> JSON. The capacity model and per-GPU load are not stored: they are rebuilt
by re-attaching every running task, which also re-checks that nothing is over-allocated."""

from __future__ import annotations

import heapq
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from market_pipeline.fleet.catalog import FleetCatalog
from market_pipeline.fleet.twin import FleetTwin, RunningTask, TwinParams
from market_pipeline.fleet.workload import Job, WorkloadModel
from market_pipeline.hardware.protocol import NodeState
from market_pipeline.placement.capacity import Placement, PodRequest
from market_pipeline.placement.policies import PlacementPolicy

if TYPE_CHECKING:
    from market_pipeline.fleet.setup import FleetSetup

STATE_VERSION = 1


class TwinStateError(ValueError):
    """Stored twin state is unreadable or belongs to another fleet/seed; the message says which."""


def _placement_json(p: Placement) -> dict[str, Any]:
    return {
        "node": p.node,
        "gpus": list(p.gpus),
        "milli": p.milli,
        "mig_start": p.mig_start,
        "mig_slices": p.mig_slices,
        "mig_instance": p.mig_instance,
    }


def _placement(data: dict[str, Any]) -> Placement:
    return Placement(
        int(data["node"]),
        tuple(int(g) for g in data["gpus"]),
        int(data["milli"]),
        int(data["mig_start"]),
        int(data["mig_slices"]),
        bool(data["mig_instance"]),
    )


def _request_json(t: float, req: PodRequest) -> list[Any]:
    return [t, req.num_gpu, req.gpu_milli, req.cpu_milli, req.mem_mib, list(req.models)]


def _request(data: list[Any]) -> tuple[float, PodRequest]:
    t, num_gpu, gpu_milli, cpu_milli, mem_mib, models = data
    return float(t), PodRequest(
        int(num_gpu), int(gpu_milli), int(cpu_milli), int(mem_mib), tuple(map(str, models))
    )


def _task_json(task: RunningTask) -> dict[str, Any]:
    return {
        "job": task.job.to_json(),
        "placement": _placement_json(task.placement),
        "positions": task.positions,
        "started_ts": task.started_ts,
        "end_ts": task.end_ts,
        "drain_signal_ts": task.drain_signal_ts,
        "sigterm_ts": task.sigterm_ts,
        "checkpoint_ts": task.checkpoint_ts,
        "mig_profile": task.mig_profile,
    }


def _task(data: dict[str, Any]) -> RunningTask:
    return RunningTask(
        Job.from_json(data["job"]),
        _placement(data["placement"]),
        [int(p) for p in data["positions"]],
        int(data["started_ts"]),
        int(data["end_ts"]),
        data["drain_signal_ts"],
        data["sigterm_ts"],
        data["checkpoint_ts"],
        data["mig_profile"],
    )


def identity(
    seed: int, params: TwinParams, catalog: FleetCatalog, workload_source: str, policy: str
) -> dict[str, Any]:
    """What a stored state must match to be resumed by this configuration."""
    return {
        "seed": seed,
        "sample_interval_s": params.sample_interval_s,
        "fleet_fingerprint": catalog.fingerprint,
        "workload_source": workload_source,
        "policy": policy,
    }


def expected_identity(setup: "FleetSetup", policy: str) -> dict[str, Any]:
    return identity(setup.seed, setup.params, setup.catalog, setup.workload_source, policy)


def twin_to_state(twin: FleetTwin, workload_source: str, generation: int) -> dict[str, Any]:
    heap = [
        [ts, order, key, kind, payload.to_json() if kind == "arrival" else payload]
        for ts, order, key, kind, payload in twin.heap
    ]
    return {
        "version": STATE_VERSION,
        "generation": generation,
        **identity(twin.seed, twin.params, twin.catalog, workload_source, twin.policy.name),
        "epoch_ts": twin.epoch_ts,
        "clock": twin.clock,
        "next_tick": twin.next_tick,
        "blocks_generated": twin.blocks_generated,
        "policy_state": twin.policy.state(),
        "node_state": [s.value for s in twin.node_state],
        "cordoned": [int(i) for i in np.flatnonzero(twin.cordoned)],
        "joining": {str(row): ts for row, ts in twin.joining.items()},
        "running": [_task_json(t) for _, t in sorted(twin.running.items())],
        "pending": [j.to_json() for j in twin.pending],
        "heap": heap,
        "xid_pending": {str(int(g)): int(twin.xid_pending[g]) for g in np.flatnonzero(twin.xid_pending)},
        "stats": dict(twin.stats),
        "refused_tenants": dict(twin.refused_tenants),
        "requeueable": {task_id: job.to_json() for task_id, job in twin.requeueable.items()},
        # the guaranteed arrivals' forecast (`placement.guarantee.GuaranteedForecast`)
        "guaranteed_arrivals": []
        if twin.forecast is None
        else [_request_json(t, req) for t, req in twin.forecast.records],
    }


def check_identity(state: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    if state.get("version") != STATE_VERSION:
        raise TwinStateError(
            f"{where}: state version {state.get('version')!r}, this code reads {STATE_VERSION}"
        )
    for key, value in expected.items():
        if state.get(key) != value:
            raise TwinStateError(
                f"{where}: stored {key}={state.get(key)!r} but the configuration gives {value!r}; "
                "delete the state (and its .d folder) or point adapter.state_path elsewhere"
            )


def twin_from_state(
    state: dict[str, Any],
    catalog: FleetCatalog,
    workload: WorkloadModel,
    policy: PlacementPolicy,
    params: TwinParams,
    where: str,
) -> FleetTwin:
    try:
        twin = FleetTwin(catalog, workload, policy, params, int(state["seed"]), int(state["epoch_ts"]))
        twin.clock = int(state["clock"])
        twin.next_tick = int(state["next_tick"])
        twin.blocks_generated = int(state["blocks_generated"])
        policy.load_state(state.get("policy_state", {}))
        cordoned = set(state["cordoned"])
        for row, value in enumerate(state["node_state"]):
            twin.cordoned[row] = row in cordoned
            twin.set_node_state(row, NodeState(value))
        twin.joining = {int(row): int(ts) for row, ts in state["joining"].items()}
        for data in state["running"]:
            twin.attach(_task(data))
        twin.pending = [Job.from_json(j) for j in state["pending"]]
        twin.heap = [
            (int(ts), int(order), str(key), kind, Job.from_json(p) if kind == "arrival" else p)
            for ts, order, key, kind, p in state["heap"]
        ]
        heapq.heapify(twin.heap)
        for pos, count in state["xid_pending"].items():
            twin.xid_pending[int(pos)] = int(count)
        twin.stats = Counter(state["stats"])
        twin.refused_tenants = {str(k): str(v) for k, v in state.get("refused_tenants", {}).items()}
        twin.requeueable = {str(k): Job.from_json(v) for k, v in state.get("requeueable", {}).items()}
        if twin.forecast is not None:
            for data in state.get("guaranteed_arrivals", []):
                twin.forecast.record(*_request(data))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, TwinStateError):
            raise
        raise TwinStateError(
            f"{where}: stored twin state is inconsistent ({type(exc).__name__}: {exc})"
        ) from exc
    return twin
