"""The rigid guarantee's placement rules on a backend that starts work itself (Slurm).

The simulator and the fleet's digital twin place every job themselves, so they apply the
rules of `placement.guarantee` inside their own placement. Where the cluster's scheduler
places the work, the rules act on its queue instead, once a control tick, from the
`drain_requests` asset, through two optional adapter methods:
- rule 4, `close_to_drainable`: while guaranteed work waits on a GPU model, the pending
  drainable jobs asking for it start no sooner than a lease ahead;
- rules 5 and 6, `keep_off_drainable`: the nodes the guaranteed arrivals forecast within one
  SLA wait would take, the empty largest nodes kept for whole-node guaranteed work, and the
  nodes refilling that stock, take no new drainable work.

The node set is the shared policy's (`GuaranteedForecast`, `reserved_nodes`, `kept_empty`,
`refilling_nodes`) on the fleet's inventory
as the adapter reports it; only applying it is the backend's. Local-process and NVML have no
queue, the twin applies the rules itself: for them both passes return None.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np

from market_pipeline.drain.service import waiting_guaranteed
from market_pipeline.hardware.protocol import (
    DrainableClosure,
    DrainableKeptOff,
    GpuInfo,
    GuaranteedArrival,
    NodeAdapter,
    NodeInfo,
    NodeState,
    ResourceClass,
    TaskInfo,
    adapter_now,
)
from market_pipeline.placement.capacity import MILLI, ClusterCapacity, PodRequest
from market_pipeline.placement.guarantee import (
    GuaranteedForecast,
    closed_models,
    kept_empty,
    refilling_nodes,
    reserved_nodes,
)

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig
    from market_pipeline.config.model import RigidGuaranteeConfig

# a rule 4 deferral lasts this many control ticks unless renewed: a stopped loop's lapse
CLOSURE_LEASE_TICKS = 2


def close_to_drainable(adapter: NodeAdapter, config: MarketPipelineConfig) -> DrainableClosure | None:
    """Rule 4 of the rigid guarantee (`close_to_drainable`) on a backend that starts work
    itself (Slurm's `close_to_drainable`; an optional method: the fleet's twin applies the
    rule in its own placement, and local-process and NVML have no queue): the GPU models
    guaranteed work waits on take no new drainable work this tick and the next
    (`CLOSURE_LEASE_TICKS`, renewed every tick while it waits). None where the backend has no
    such queue or the rule is off. In shadow mode nothing is acted on; the closure says what
    would have been deferred."""
    close = getattr(adapter, "close_to_drainable", None)
    guarantee = config.guardrails.rigid_guarantee
    if not callable(close) or not (guarantee.enabled and guarantee.close_to_drainable):
        return None
    models = closed_models(w.gpu_model for w in waiting_guaranteed(adapter))
    lease = CLOSURE_LEASE_TICKS * config.loop.tick_minutes * 60.0
    return close(models, lease, act=not config.loop.shadow_mode)


def keep_off_drainable(adapter: NodeAdapter, config: MarketPipelineConfig) -> DrainableKeptOff | None:
    """Rules 5 and 6 of the rigid guarantee (`forecast_window_minutes`; `empty_nodes_kept`,
    `refill_empty_nodes`) on a backend that starts work itself (Slurm's `keep_drainable_off`;
    an optional method): the nodes `kept_for_arrivals` and `whole_node_stock` pick on
    the fleet as it is now take no new drainable work until a later pass gives them back.
    With the rules off (or the guarantee disabled) the set is empty, so the backend gives back
    whatever an earlier pass kept. None where the backend has no such queue. In shadow mode
    nothing is applied; the answer says what would be kept."""
    keep_off = getattr(adapter, "keep_drainable_off", None)
    if not callable(keep_off):
        return None
    guarantee = config.guardrails.rigid_guarantee
    nodes, gpus, tasks = adapter.list_nodes(), adapter.list_gpus(), adapter.list_tasks()
    cap, guaranteed = inventory_capacity(nodes, gpus, tasks)
    kept = whole_node_stock(cap, guaranteed, guarantee)
    window_s = 60.0 * guarantee.forecast_window_minutes
    arrivals = getattr(adapter, "guaranteed_arrivals", None)
    if guarantee.enabled and window_s > 0 and callable(arrivals):
        now = adapter_now(adapter)
        horizon_s = config.guardrails.task_drain.max_total_seconds
        kept |= kept_for_arrivals(cap, arrivals(now - timedelta(seconds=window_s)), now, window_s, horizon_s)
    return keep_off(tuple(cap.node_ids[i] for i in np.flatnonzero(kept)), act=not config.loop.shadow_mode)


def kept_for_arrivals(
    cap: ClusterCapacity,
    arrivals: Sequence[GuaranteedArrival],
    now: datetime,
    window_s: float,
    horizon_s: float,
) -> np.ndarray:
    """(N,) bool: the nodes rule 5 keeps from new drainable work for the guaranteed arrivals
    forecast within `horizon_s` (one SLA wait): the arrivals of the trailing `window_s`
    (`GuaranteedForecast`, the naive rate of a Poisson stream, the latest shapes as they
    came), placed virtually, best fit, on the room free now (`placement.guarantee.
    reserved_nodes`), as the twin and the simulator keep it. A job asking several nodes is one
    arrival per node; Slurm asks whole GPUs of one model (any, where it names none)."""
    if window_s <= 0 or horizon_s <= 0 or not arrivals or cap.n_nodes == 0:
        return np.zeros(cap.n_nodes, dtype=bool)
    forecast = GuaranteedForecast(window_s)
    for arrival in sorted(arrivals, key=lambda a: a.arrived_at):
        models = (arrival.gpu_model,) if arrival.gpu_model else ()
        req = PodRequest(arrival.num_gpu, MILLI, models=models)
        for _ in range(arrival.nodes):
            forecast.record(arrival.arrived_at.timestamp(), req)
    return reserved_nodes(cap, forecast.expected(now.timestamp(), horizon_s))


def whole_node_stock(
    cap: ClusterCapacity, guaranteed: np.ndarray, guarantee: RigidGuaranteeConfig
) -> np.ndarray:
    """(N,) bool: per GPU model, its last empty largest nodes (`placement.guarantee.kept_empty`)
    and, while fewer than the keep are empty, the largest nodes running no guaranteed work
    (`guaranteed`) nearest to empty (`placement.guarantee.refilling_nodes`). The inventory
    knows GPUs only (a backend reports no free CPU or memory per node), and that is all these
    two rules read: a GPU is free where no running task holds any of it."""
    if not (guarantee.enabled and guarantee.empty_nodes_kept > 0) or cap.n_nodes == 0:
        return np.zeros(cap.n_nodes, dtype=bool)
    kept = kept_empty(cap, guarantee.empty_nodes_kept)
    if guarantee.refill_empty_nodes:
        kept |= refilling_nodes(cap, guarantee.empty_nodes_kept, guaranteed)
    return kept


def inventory_capacity(
    nodes: Sequence[NodeInfo], gpus: Sequence[GpuInfo], tasks: Sequence[TaskInfo]
) -> tuple[ClusterCapacity, np.ndarray]:
    """The GPU nodes of an inventory as the placement rules read a fleet: their GPUs per model,
    schedulable where ON and not cordoned, each GPU's free share less what the running tasks
    hold of it; and (N,) bool, the nodes running guaranteed work. CPU and memory are not
    reported per node by the backends, so they are left out (one unit each, never short)."""
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    cap = ClusterCapacity.build(
        node_ids=[n.node_id for n in gpu_nodes],
        models=[n.gpu_model for n in gpu_nodes],
        gpus=[min(n.gpus, 16) for n in gpu_nodes],
        cpu_milli=[1] * len(gpu_nodes),
        mem_mib=[1] * len(gpu_nodes),
        schedulable=[n.state is NodeState.ON and not n.cordoned for n in gpu_nodes],
    )
    row = {node_id: i for i, node_id in enumerate(cap.node_ids)}
    slot = {g.gpu_uuid: (row[g.node_id], g.gpu_index) for g in gpus if g.node_id in row}
    guaranteed = np.zeros(cap.n_nodes, dtype=bool)
    for task in tasks:
        if task.node_id in row and task.resource_class is ResourceClass.GUARANTEED:
            guaranteed[row[task.node_id]] = True
        for uuid in task.gpu_uuids:
            at = slot.get(uuid)
            if at is not None and at[1] < cap.gpu_free.shape[1]:
                cap.gpu_free[at] = max(int(cap.gpu_free[at]) - max(task.gpu_milli, 1), 0)
    return cap, guaranteed
