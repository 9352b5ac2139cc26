"""Placement policies over a ClusterCapacity: round_robin, best_fit, fragment_aware (FGD).

Every policy answers `choose(cap, req) -> Placement | None` without mutating `cap`; the
caller allocates. Node choice is vectorised over all nodes; slot choice within the chosen
node honours MIG geometry, fractional sharing and NVLink domains (multi-GPU requests take
whole GPUs on one node, preferably inside one NVLink domain).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from market_pipeline.gpus.models import MIG_SLICES
from market_pipeline.placement.capacity import (
    MILLI,
    ClusterCapacity,
    Placement,
    PlacementError,
    PodRequest,
    mig_slices_for,
    slice_milli,
)
from market_pipeline.placement.fragmentation import (
    DEFAULT_SINGLE_POD_WEIGHT,
    FragmentTerms,
    mig_start_for,
)
from market_pipeline.placement.typical import TypicalPods


class PlacementPolicy(Protocol):
    name: str

    def choose(self, cap: ClusterCapacity, req: PodRequest) -> Placement | None: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


def build_placement(
    cap: ClusterCapacity, req: PodRequest, node: int, fits_row: np.ndarray | None, prefer: str = "best"
) -> Placement:
    """Slots on `node` for `req`: fractional -> one GPU ('best': fullest that fits,
    'first': lowest index); whole GPUs -> fully free ones in as few NVLink domains as possible."""
    if req.num_gpu == 0:
        return Placement(node, (), 0)
    if fits_row is None:
        raise PlacementError("GPU requests need the node's fitting slots")
    if req.fractional:
        candidates = np.flatnonzero(fits_row)
        if prefer == "best":
            candidates = candidates[np.argsort(cap.gpu_free[node, candidates], kind="stable")]
        return fraction_on_slot(cap, req, node, int(candidates[0]))
    slots = whole_gpu_slots(cap, node, req.num_gpu, fits_row)
    if cap.node_mig[node]:
        return Placement(node, slots, MILLI, mig_start=0, mig_slices=MIG_SLICES)
    return Placement(node, slots, MILLI)


def fraction_on_slot(cap: ClusterCapacity, req: PodRequest, node: int, slot: int) -> Placement:
    if cap.node_mig[node]:
        sizes = cap.model_mig_sizes[int(cap.model_code[node])]
        slices = mig_slices_for(req.gpu_milli, sizes)
        start = mig_start_for(cap, node, slot, slices)
        if start < 0:
            raise PlacementError(f"node {cap.node_ids[node]} GPU {slot}: no room for a {slices}g instance")
        return Placement(node, (slot,), slice_milli(slices), start, slices, mig_instance=True)
    return Placement(node, (slot,), req.gpu_milli)


def whole_gpu_slots(cap: ClusterCapacity, node: int, k: int, fits_row: np.ndarray) -> tuple[int, ...]:
    """k fully free slots; inside one NVLink domain when one has room (the tightest such
    domain, keeping roomy domains for bigger jobs), else spanning the fewest domains."""
    free_slots = np.flatnonzero(fits_row)
    if len(free_slots) < k:
        raise PlacementError(f"node {cap.node_ids[node]} has {len(free_slots)} free GPUs, need {k}")
    domains = cap.domain[node, free_slots]
    ids, counts = np.unique(domains, return_counts=True)
    roomy = counts >= k
    if roomy.any():
        best = ids[roomy][np.argmin(counts[roomy])]
        return tuple(int(s) for s in free_slots[domains == best][:k])
    order = ids[np.lexsort((ids, -counts))]
    ranked = np.concatenate([free_slots[domains == d] for d in order])
    return tuple(int(s) for s in ranked[:k])


def _fits_and_feasible(cap: ClusterCapacity, req: PodRequest) -> tuple[np.ndarray | None, np.ndarray]:
    fits = cap.gpu_fits(req) if req.num_gpu else None
    return fits, cap.feasible_nodes(req, fits)


def packing_score(cap: ClusterCapacity, req: PodRequest) -> np.ndarray:
    """(N,) best-fit score: normalised CPU and GPU left after placing `req`, lower = tighter
    (the FGD simulator's BestFit: weights 0.5/0.5, normalised by the largest node)."""
    cpu_scale = max(int(cap.cpu_total.max()), 1) if cap.n_nodes else 1
    gpu_scale = max(int(cap.present.sum(axis=1).max()) * MILLI, 1) if cap.n_nodes else 1
    gpu_left = cap.gpu_free.sum(axis=1) - req.num_gpu * req.gpu_milli
    return 0.5 * (cap.cpu_free - req.cpu_milli) / cpu_scale + 0.5 * gpu_left / gpu_scale


class RoundRobin:
    """Next feasible node after the last one used (cyclic); first fitting GPU on it."""

    name = "round_robin"

    def __init__(self) -> None:
        self.next_node = 0

    def choose(self, cap: ClusterCapacity, req: PodRequest) -> Placement | None:
        fits, feasible = _fits_and_feasible(cap, req)
        nodes = np.flatnonzero(feasible)
        if len(nodes) == 0:
            return None
        pos = int(np.searchsorted(nodes, self.next_node))
        node = int(nodes[pos] if pos < len(nodes) else nodes[0])
        self.next_node = node + 1
        return build_placement(cap, req, node, None if fits is None else fits[node], "first")

    def state(self) -> dict[str, Any]:
        return {"next_node": self.next_node}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.next_node = int(state.get("next_node", 0))


class BestFit:
    """The feasible node left with the least CPU+GPU; on it the fullest GPU that fits."""

    name = "best_fit"

    def choose(self, cap: ClusterCapacity, req: PodRequest) -> Placement | None:
        fits, feasible = _fits_and_feasible(cap, req)
        if not feasible.any():
            return None
        score = np.where(feasible, packing_score(cap, req), np.inf)
        node = int(np.argmin(score))
        return build_placement(cap, req, node, None if fits is None else fits[node], "best")

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        return None


class FragmentAware:
    """The node and GPU whose use grows the expected fragmentation F_n(M) least (FGD, with
    the packing view of `fragmentation.py` blended in); ties go to the tighter node."""

    name = "fragment_aware"

    def __init__(self, typical: TypicalPods, single_pod_weight: float = DEFAULT_SINGLE_POD_WEIGHT) -> None:
        self.typical = typical
        self.single_pod_weight = single_pod_weight
        self._terms = FragmentTerms(typical, single_pod_weight)

    def choose(self, cap: ClusterCapacity, req: PodRequest) -> Placement | None:
        fits, feasible = _fits_and_feasible(cap, req)
        if not feasible.any():
            return None
        self._terms.refresh(cap)
        tie = packing_score(cap, req)
        if req.fractional:
            assert fits is not None
            rows, slots = np.nonzero(fits & feasible[:, None])
            # slots of one node in the same state give the same delta: score each state once
            state = np.where(
                cap.node_mig[rows],
                1024 + cap.mig_occ[rows, slots].astype(np.int64),
                cap.gpu_free[rows, slots],
            )
            _, first = np.unique(rows.astype(np.int64) * 2048 + state, return_index=True)
            rows, slots = rows[first], slots[first]
            delta = self._terms.delta_fraction(cap, req, rows, slots)
            best = _lexmin(delta, tie[rows], cap.gpu_free[rows, slots], rows)
            return fraction_on_slot(cap, req, int(rows[best]), int(slots[best]))
        rows = np.flatnonzero(feasible)
        delta = self._terms.delta_whole(cap, req, rows)
        node = int(rows[_lexmin(delta, tie[rows], rows)])
        return build_placement(cap, req, node, None if fits is None else fits[node], "best")

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        return None


def _lexmin(delta: np.ndarray, *tie_breaks: np.ndarray) -> int:
    """Index of the smallest delta; float noise below 1e-6 milli is a tie, broken in order."""
    keys = (*reversed(tie_breaks), np.round(delta, 6))
    return int(np.lexsort(keys)[0])


POLICY_NAMES: tuple[str, ...] = ("round_robin", "best_fit", "fragment_aware")


def make_policy(
    name: str, typical: TypicalPods | None = None, single_pod_weight: float = DEFAULT_SINGLE_POD_WEIGHT
) -> PlacementPolicy:
    """A policy by name; fragment_aware needs the workload's typical pods."""
    if name == "round_robin":
        return RoundRobin()
    if name == "best_fit":
        return BestFit()
    if name == "fragment_aware":
        if typical is None:
            raise PlacementError("fragment_aware needs the workload's typical pods (TypicalPods)")
        return FragmentAware(typical, single_pod_weight)
    raise PlacementError(f"unknown placement policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
