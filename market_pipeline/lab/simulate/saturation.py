"""Placement policies at saturation, measured as FGD does (Weng et al., ATC'23), by the
placement package's own replay (`lab.placement.saturation.saturation_replay`): the pod list in
trace order, cycling, until the GPUs asked for reach the cluster's capacity; pods that do
not fit are rejected and counted; the GPUs left unallocated then, and the allocation ratio."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from market_pipeline.lab.placement.saturation import load_openb_experiment, saturation_replay
from market_pipeline.lab.simulate.inputs import FleetNodes, PodTable
from market_pipeline.placement.capacity import ClusterCapacity, PodRequest
from market_pipeline.placement.typical import TypicalPods

PlacementInputs = tuple[ClusterCapacity, list[PodRequest]]


def experiment_from_files(nodes: str | Path, pods: str | Path) -> PlacementInputs:
    """FGD's experiment: the whole node list and pod list (CPU-only pods included)."""
    return load_openb_experiment(nodes, pods)


def experiment_from_tables(nodes: FleetNodes, pods: PodTable) -> PlacementInputs:
    """The same experiment on in-memory tables (GPU nodes and GPU pods only)."""
    capacity = ClusterCapacity.build(
        list(nodes.node_ids),
        list(nodes.models),
        nodes.gpus.tolist(),
        nodes.cpu_milli.tolist(),
        nodes.mem_mib.tolist(),
        mig_sizes_by_model={m: nodes.spec(m).mig_slice_sizes for m in nodes.model_names()},
        nvlink_domain_by_model={m: nodes.spec(m).nvlink_domain for m in nodes.model_names()},
    )
    requests = [
        PodRequest(int(n), int(m), int(c), int(mem), spec)
        for n, m, c, mem, spec in zip(
            pods.num_gpu.tolist(),
            pods.gpu_milli.tolist(),
            pods.cpu_milli.tolist(),
            pods.mem_mib.tolist(),
            pods.gpu_spec,
        )
    ]
    return capacity, requests


def compare_placement(experiment: PlacementInputs, policies: Sequence[str]) -> dict[str, Any]:
    """One saturation replay per policy, against the same typical pods."""
    if not policies:
        return {}
    capacity, requests = experiment
    typical = TypicalPods.from_requests(requests)
    return {name: saturation_replay(capacity, requests, name, typical) for name in policies}
