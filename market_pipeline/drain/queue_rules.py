"""The rigid guarantee's placement rules on a backend that starts work itself (Slurm).

The simulator and the fleet's digital twin place every job themselves, so they apply the
rules of `placement.guarantee` inside their own placement. Where the cluster's scheduler
places the work, the rules act on its queue instead, once a control tick, from the
`drain_requests` asset, through two optional adapter methods:
- rule 4, `close_to_drainable`: while guaranteed work waits on a GPU model, the pending
  drainable jobs asking for it start no sooner than a lease ahead;
- rule 6, `keep_off_drainable`: the empty largest nodes kept for whole-node guaranteed work,
  and the nodes refilling that stock, take no new drainable work.

The node set is the shared policy's (`kept_empty`, `refilling_nodes`) on the fleet's inventory
as the adapter reports it; only applying it is the backend's. Local-process and NVML have no
queue, the twin applies the rules itself: for them both passes return None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from market_pipeline.drain.service import waiting_guaranteed
from market_pipeline.hardware.protocol import (
    DrainableClosure,
    DrainableKeptOff,
    GpuInfo,
    NodeAdapter,
    NodeInfo,
    NodeState,
    ResourceClass,
    TaskInfo,
)
from market_pipeline.placement.capacity import ClusterCapacity
from market_pipeline.placement.guarantee import closed_models, kept_empty, refilling_nodes

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
    """Rule 6 of the rigid guarantee (`empty_nodes_kept`, `refill_empty_nodes`) on a backend
    that starts work itself (Slurm's `keep_drainable_off`; an optional method): the nodes
    `kept_for_whole_node_work` picks on the fleet as it is now take no new drainable work until
    a later pass gives them back. With the rule off (or the guarantee disabled) the set is
    empty, so the backend gives back whatever an earlier pass kept. None where the backend has
    no such queue. In shadow mode nothing is applied; the answer says what would be kept."""
    keep_off = getattr(adapter, "keep_drainable_off", None)
    if not callable(keep_off):
        return None
    nodes = kept_for_whole_node_work(
        adapter.list_nodes(), adapter.list_gpus(), adapter.list_tasks(), config.guardrails.rigid_guarantee
    )
    return keep_off(nodes, act=not config.loop.shadow_mode)


def kept_for_whole_node_work(
    nodes: Sequence[NodeInfo],
    gpus: Sequence[GpuInfo],
    tasks: Sequence[TaskInfo],
    guarantee: RigidGuaranteeConfig,
) -> tuple[str, ...]:
    """The nodes rule 6 keeps from new drainable work on a fleet's inventory: per GPU model,
    its last empty largest nodes (`placement.guarantee.kept_empty`) and, while fewer than the
    keep are empty, the largest nodes running no guaranteed work nearest to empty
    (`placement.guarantee.refilling_nodes`), in the order `nodes` lists them. The inventory
    knows GPUs only (a backend reports no free CPU or memory per node), and that is all these
    two rules read: a GPU is free where no running task holds any of it."""
    if not (guarantee.enabled and guarantee.empty_nodes_kept > 0):
        return ()
    cap, guaranteed = inventory_capacity(nodes, gpus, tasks)
    if cap.n_nodes == 0:
        return ()
    kept = kept_empty(cap, guarantee.empty_nodes_kept)
    if guarantee.refill_empty_nodes:
        kept |= refilling_nodes(cap, guarantee.empty_nodes_kept, guaranteed)
    return tuple(cap.node_ids[i] for i in np.flatnonzero(kept))


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
