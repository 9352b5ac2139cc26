"""Placement policies never over-allocate, keep multi-GPU jobs on one node, honour GPU
types, MIG geometry and NVLink domains, and never miss a feasible placement."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.gpus.models import MIG_STARTS
from market_pipeline.placement.capacity import (
    MILLI,
    ClusterCapacity,
    Placement,
    PlacementError,
    PodRequest,
)
from market_pipeline.placement.policies import POLICY_NAMES, make_policy
from market_pipeline.placement.typical import TypicalPods

MODELS = ("A100", "V100M32", "T4")


def _cluster() -> ClusterCapacity:
    models = ["A100"] * 3 + ["V100M32"] * 3 + ["T4"] * 4
    gpus = [8] * 3 + [8] * 3 + [2] * 4
    return ClusterCapacity.build(
        node_ids=[f"n{i}" for i in range(10)],
        models=models,
        gpus=gpus,
        cpu_milli=[96_000] * 6 + [32_000] * 4,
        mem_mib=[512_000] * 6 + [128_000] * 4,
        mig_sizes_by_model={"A100": (1, 2, 3, 4, 7)},
        nvlink_domain_by_model={"A100": 8, "V100M32": 4},
    )


def _requests(rng: np.random.Generator, n: int) -> list[PodRequest]:
    out = []
    for _ in range(n):
        kind = rng.choice(["frac", "one", "multi", "cpu"], p=[0.45, 0.35, 0.1, 0.1])
        models = () if rng.random() < 0.5 else (str(rng.choice(MODELS)),)
        cpu, mem = int(rng.integers(1, 16)) * 1000, int(rng.integers(1, 64)) * 1024
        if kind == "frac":
            out.append(PodRequest(1, int(rng.choice([110, 230, 470, 650, 810])), cpu, mem, models))
        elif kind == "one":
            out.append(PodRequest(1, MILLI, cpu, mem, models))
        elif kind == "multi":
            out.append(PodRequest(int(rng.choice([2, 4, 8])), MILLI, cpu, mem, models))
        else:
            out.append(PodRequest(0, 0, cpu, mem))
    return out


def _check(cap: ClusterCapacity, before: ClusterCapacity, req: PodRequest, p: Placement) -> None:
    node = p.node
    assert cap.schedulable[node]
    assert not req.models or cap.model_names[cap.model_code[node]] in req.models
    assert len(p.gpus) == req.num_gpu == len(set(p.gpus))
    if req.num_gpu > 1 or req.gpu_milli == MILLI:
        assert p.milli == MILLI and all(before.gpu_free[node, g] == MILLI for g in p.gpus)
    if req.fractional and cap.node_mig[node]:
        assert p.mig_instance and p.mig_start in MIG_STARTS[p.mig_slices]
        assert p.milli >= req.gpu_milli * 0.99 or p.mig_slices == 7


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_placement_random_stream_keeps_every_invariant(name: str) -> None:
    rng = np.random.default_rng(11)
    reqs = _requests(rng, 400)
    cap = _cluster()
    policy = make_policy(name, TypicalPods.from_requests(reqs))
    placed: list[tuple[PodRequest, Placement]] = []
    for i, req in enumerate(reqs):
        if placed and i % 3 == 0:  # departures keep the cluster churning
            old_req, old = placed.pop(int(rng.integers(len(placed))))
            cap.release(old_req, old)
        before = cap.copy()
        p = policy.choose(cap, req)
        if p is None:
            assert not cap.feasible_nodes(req).any()  # a policy never misses a fitting node
            continue
        _check(cap, before, req, p)
        cap.allocate(req, p)
        placed.append((req, p))
        assert (cap.gpu_free >= 0).all() and (cap.gpu_free <= MILLI).all()
        assert (cap.cpu_free >= 0).all() and (cap.mem_free >= 0).all()
        assert (cap.gpu_free[~cap.present] == 0).all()
    for req, p in placed:
        cap.release(req, p)
    fresh = _cluster()
    assert (cap.gpu_free == fresh.gpu_free).all() and (cap.mig_occ == 0).all()
    assert (cap.cpu_free == fresh.cpu_free).all()


def test_placement_allocate_refuses_to_over_allocate() -> None:
    cap = _cluster()
    req = PodRequest(1, 700, 1000, 1024, ("T4",))
    cap.allocate(req, Placement(6, (0,), 700))
    with pytest.raises(PlacementError, match="700 milli requested, 300 free"):
        cap.allocate(req, Placement(6, (0,), 700))
    with pytest.raises(PlacementError, match="no GPU slot 5"):
        cap.allocate(req, Placement(6, (5,), 700))
    with pytest.raises(PlacementError, match="whole GPUs"):
        PodRequest(2, 500)
    mig = PodRequest(1, 300, 0, 0, ("A100",))
    cap.allocate(mig, Placement(0, (0,), 428, mig_start=0, mig_slices=3, mig_instance=True))
    with pytest.raises(PlacementError, match="MIG slices already in use"):
        cap.allocate(mig, Placement(0, (0,), 428, mig_start=0, mig_slices=3, mig_instance=True))
    with pytest.raises(PlacementError, match="cannot start at slice 1"):
        cap.allocate(mig, Placement(0, (1,), 428, mig_start=1, mig_slices=3, mig_instance=True))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_placement_gpu_type_constraint_is_honoured(name: str) -> None:
    cap = _cluster()
    typical = TypicalPods.from_requests([PodRequest(1, 500)])
    policy = make_policy(name, typical)
    for _ in range(8):  # 4 T4 nodes x 2 GPUs
        p = policy.choose(cap, PodRequest(1, MILLI, 1000, 1024, ("T4",)))
        assert p is not None and cap.model_names[cap.model_code[p.node]] == "T4"
        cap.allocate(PodRequest(1, MILLI, 1000, 1024, ("T4",)), p)
    assert policy.choose(cap, PodRequest(1, MILLI, 1000, 1024, ("T4",))) is None
    assert policy.choose(cap, PodRequest(1, MILLI, 1000, 1024, ("H100",))) is None  # no such GPUs


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_placement_multi_gpu_prefers_one_nvlink_domain(name: str) -> None:
    cap = ClusterCapacity.build(
        ["v0"], ["V100M32"], [8], [96_000], [512_000], nvlink_domain_by_model={"V100M32": 4}
    )
    one = PodRequest(1, MILLI)
    cap.allocate(one, Placement(0, (0,), MILLI))  # domain 0 keeps 3 free, domain 1 keeps 4
    policy = make_policy(name, TypicalPods.from_requests([one]))
    four = policy.choose(cap, PodRequest(4, MILLI))
    assert four is not None and sorted(four.gpus) == [4, 5, 6, 7]
    two = policy.choose(cap, PodRequest(2, MILLI))
    assert two is not None and {g // 4 for g in two.gpus} == {0}  # the tighter domain with room


def test_placement_fractional_requests_become_mig_instances() -> None:
    cap = _cluster()
    policy = make_policy("best_fit")
    shapes = {110: 1, 230: 2, 470: 4, 650: 7}
    for milli, slices in shapes.items():
        req = PodRequest(1, milli, 0, 0, ("A100",))
        p = policy.choose(cap, req)
        assert p is not None and p.mig_slices == slices and p.mig_instance
        cap.allocate(req, p)
    slices_used = sum(bin(int(occ)).count("1") for occ in cap.mig_occ[cap.node_mig].ravel())
    assert slices_used == 1 + 2 + 4 + 7
    assert cap.gpu_free[0, 0] < MILLI  # best fit packs the small instances onto one GPU
