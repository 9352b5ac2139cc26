"""The fragmentation metric and the FGD saturation replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from market_pipeline.lab.placement.saturation import (
    compare_policies,
    load_openb_experiment,
    saturation_replay,
)
from market_pipeline.placement.capacity import MILLI, ClusterCapacity, Placement, PlacementError, PodRequest
from market_pipeline.placement.fragmentation import FragmentTerms, cluster_fragmentation, node_fragmentation
from market_pipeline.placement.policies import fraction_on_slot
from market_pipeline.placement.typical import TypicalPods


def _node(free_second: int, cpu: int = 64_000) -> ClusterCapacity:
    cap = ClusterCapacity.build(["n0"], ["T4"], [2], [cpu], [1 << 20])
    if free_second < MILLI:
        cap.allocate(PodRequest(1, MILLI - free_second), Placement(0, (1,), MILLI - free_second))
    return cap


def _typical() -> TypicalPods:
    # half the pods want 500 milli, half a whole GPU; both 8 cores
    return TypicalPods(np.array([1, 1]), np.array([500, 1000]), np.array([8000, 8000]), np.array([0.5, 0.5]))


def test_placement_fragmentation_by_hand() -> None:
    cap = _node(free_second=300)  # free: [1000, 300]
    # single-pod view: both classes run; the 300-milli GPU is too small for either
    assert node_fragmentation(cap, _typical(), single_pod_weight=1.0)[0] == pytest.approx(300)
    # packing view: 500s fill 1000 twice (300 left), wholes take one GPU (300 left)
    assert node_fragmentation(cap, _typical(), single_pod_weight=0.0)[0] == pytest.approx(300)
    starved = _node(free_second=300, cpu=8000)  # CPU for one pod only
    # one 500-milli copy fits the CPU: 800 stranded; one whole GPU: 300 stranded
    assert node_fragmentation(starved, _typical(), single_pod_weight=0.0)[0] == pytest.approx(550)
    no_cpu = _node(free_second=300, cpu=4000)  # nothing runs: every free milli is a fragment
    assert node_fragmentation(no_cpu, _typical(), single_pod_weight=1.0)[0] == pytest.approx(1300)
    report = cluster_fragmentation(no_cpu, _typical())
    assert report["free_gpus"] == pytest.approx(1.3) and report["fragmentation_ratio"] == pytest.approx(1.0)


def test_placement_incremental_terms_match_a_fresh_computation() -> None:
    rng = np.random.default_rng(4)
    cap = ClusterCapacity.build(
        [f"n{i}" for i in range(12)],
        ["A"] * 6 + ["M"] * 6,
        [4] * 12,
        [32_000] * 12,
        [1 << 20] * 12,
        mig_sizes_by_model={"M": (1, 2, 3, 4, 7)},
    )
    typical = TypicalPods.from_requests([PodRequest(1, m, 2000) for m in (110, 470, 810, 1000)])
    terms = FragmentTerms(typical)
    for _ in range(30):
        req = PodRequest(1, int(rng.choice([110, 470, 810])), 2000)
        node = int(rng.integers(12))
        fits = np.flatnonzero(cap.gpu_fits(req)[node])
        if not len(fits):
            continue
        cap.allocate(req, fraction_on_slot(cap, req, node, int(fits[0])))
        terms.refresh(cap)
        assert np.allclose(terms.node_fragmentation(), node_fragmentation(cap, typical))


def test_placement_typical_pods_keep_the_popular_classes() -> None:
    reqs = [PodRequest(1, 500, 1000)] * 6 + [PodRequest(1, 1000, 2000)] * 3 + [PodRequest(0, 0, 500)]
    full = TypicalPods.from_requests(reqs, coverage=1.0)
    assert full.size == 3 and full.weight.tolist() == pytest.approx([0.6, 0.3, 0.1])
    top = TypicalPods.from_requests(reqs, coverage=0.6)
    assert top.size == 1 and top.gpu_milli.tolist() == [500]
    with pytest.raises(PlacementError):
        TypicalPods.from_requests([], coverage=1.0)


def test_placement_saturation_replay_accounts_for_every_gpu() -> None:
    cap = ClusterCapacity.build(
        [f"n{i}" for i in range(20)], ["T4"] * 20, [4] * 20, [32_000] * 20, [1 << 18] * 20
    )
    rng = np.random.default_rng(2)
    pods = [
        PodRequest(1, int(m), int(c))
        for m, c in zip(rng.choice([250, 470, 1000], 60), rng.choice([2000, 6000, 12000], 60))
    ]
    result = saturation_replay(cap, pods, "best_fit")
    assert result["arrived_gpus"] >= result["cluster_gpus"] == 80
    assert result["unallocated_gpus_at_saturation"] == pytest.approx(
        result["cluster_gpus"] * (1 - result["allocation_ratio"]), abs=1e-2
    )
    assert result["placed_pods"] + result["rejected_pods"] == result["arrived_pods"]
    assert saturation_replay(cap, pods, "best_fit") | {"seconds": 0} == result | {"seconds": 0}
    assert cap.free_gpus() == 80  # the input cluster is left untouched
    with pytest.raises(PlacementError, match="ask for GPUs"):
        saturation_replay(cap, [PodRequest(0, 0, 100)], "best_fit")


def test_placement_fragment_aware_beats_best_fit_on_openb(shared_data: Path) -> None:
    folder = shared_data / "alibaba-gpu-2023"
    cap, pods = load_openb_experiment(
        folder / "openb_node_list_gpu_node.csv", folder / "openb_pod_list_default.csv"
    )
    rows = np.arange(0, cap.n_nodes, 6)  # every sixth node: a 203-node cluster, same mix
    sub = ClusterCapacity.build(
        [cap.node_ids[i] for i in rows],
        [cap.model_names[cap.model_code[i]] for i in rows],
        cap.present[rows].sum(axis=1).tolist(),
        cap.cpu_total[rows].tolist(),
        cap.mem_total[rows].tolist(),
    )
    result = compare_policies(sub, pods, ["best_fit", "fragment_aware"])
    # the full fleet (bench placement) reaches the 30%; the subset keeps a margin
    assert result["fragment_aware_reduction_vs_best_fit"] >= 0.25
