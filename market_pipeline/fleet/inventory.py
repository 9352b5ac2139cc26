"""Fleet inventory snapshots: the adapter's nodes, GPUs and tasks as warehouse rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from market_pipeline.hardware.protocol import GpuInfo, NodeInfo, TaskInfo


def unpriced_nodes(nodes: Sequence[NodeInfo], configured_pools: set[str]) -> dict[str, int]:
    """GPUs per pool id the adapter reports that no configured pool prices (a GPU model or
    zone the config does not know: add the model's ``device_names`` or the pool)."""
    out: dict[str, int] = {}
    for node in nodes:
        if node.pool_id not in configured_pools:
            out[node.pool_id] = out.get(node.pool_id, 0) + node.gpus
    return out


def nodes_frame(nodes: Sequence[NodeInfo], observed_at: datetime) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "node_id": [n.node_id for n in nodes],
            "pool_id": [n.pool_id for n in nodes],
            "gpu_model": [n.gpu_model for n in nodes],
            "zone": [n.zone for n in nodes],
            "gpus": [n.gpus for n in nodes],
            "state": [n.state.value for n in nodes],
            "cordoned": [n.cordoned for n in nodes],
            "nvlink": [n.nvlink for n in nodes],
            "observed_at": [observed_at] * len(nodes),
        },
        schema_overrides={"gpus": pl.Int32, "observed_at": pl.Datetime("us", "UTC")},
    )


def gpus_frame(gpus: Sequence[GpuInfo], observed_at: datetime) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "gpu_uuid": [g.gpu_uuid for g in gpus],
            "node_id": [g.node_id for g in gpus],
            "gpu_index": [g.gpu_index for g in gpus],
            "gpu_model": [g.gpu_model for g in gpus],
            "memory_total_mib": [g.memory_total_mib for g in gpus],
            "mig_profile": [g.mig_profile for g in gpus],
            "nvlink_peers": [list(g.nvlink_peers) for g in gpus],
            "observed_at": [observed_at] * len(gpus),
        },
        schema_overrides={
            "gpu_index": pl.Int32,
            "memory_total_mib": pl.Int32,
            "mig_profile": pl.Utf8,
            "nvlink_peers": pl.List(pl.Utf8),
            "observed_at": pl.Datetime("us", "UTC"),
        },
    )


def tasks_frame(tasks: Sequence[TaskInfo], observed_at: datetime) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "task_id": [t.task_id for t in tasks],
            "tenant_id": [t.tenant_id for t in tasks],
            "pool_id": [t.pool_id for t in tasks],
            "node_id": [t.node_id for t in tasks],
            "gpu_uuids": [list(t.gpu_uuids) for t in tasks],
            "gpu_milli": [t.gpu_milli for t in tasks],
            "kind": [t.kind.value for t in tasks],
            "qos": [t.qos for t in tasks],
            "priority": [t.priority for t in tasks],
            "resource_class": [t.resource_class.value for t in tasks],
            "mem_mib": [t.mem_mib for t in tasks],
            "mig_profile": [t.mig_profile for t in tasks],
            "do_not_drain": [t.do_not_drain for t in tasks],
            "checkpointable": [t.checkpointable for t in tasks],
            "pid": [t.pid for t in tasks],
            "started_at": [t.started_at for t in tasks],
            "last_seen_at": [observed_at] * len(tasks),
        },
        schema_overrides={
            "gpu_uuids": pl.List(pl.Utf8),
            "gpu_milli": pl.Int32,
            "priority": pl.Int32,
            "mem_mib": pl.Int32,
            "mig_profile": pl.Utf8,
            "pid": pl.Int32,
            "started_at": pl.Datetime("us", "UTC"),
            "last_seen_at": pl.Datetime("us", "UTC"),
        },
    )
