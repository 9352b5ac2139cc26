"""The capacity model placement policies work on: per node free CPU and memory, per GPU
free compute in milli-GPUs and MIG slice occupancy, as numpy arrays (nodes x GPU slots).

The digital twin, the offline simulator and the FGD saturation replay share this one model,
so a policy behaves the same wherever it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from market_pipeline.gpus.models import MIG_SLICES, MIG_STARTS

MILLI = 1000
_OCC_STATES = 1 << MIG_SLICES


class PlacementError(ValueError):
    """A request or a placement is invalid (would over-allocate, unknown slot, ...)."""


@dataclass(frozen=True)
class PodRequest:
    """What one pod/task asks for. `gpu_milli` is per GPU; multi-GPU requests take whole GPUs."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int = 0
    mem_mib: int = 0
    models: tuple[str, ...] = ()  # allowed GPU models; empty = any

    def __post_init__(self) -> None:
        if self.num_gpu < 0:
            raise PlacementError(f"num_gpu must be >= 0, got {self.num_gpu}")
        if self.num_gpu >= 1 and not 0 < self.gpu_milli <= MILLI:
            raise PlacementError(f"gpu_milli must be in 1..{MILLI}, got {self.gpu_milli}")
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise PlacementError(
                f"a {self.num_gpu}-GPU request must take whole GPUs, got gpu_milli={self.gpu_milli}"
            )
        if self.cpu_milli < 0 or self.mem_mib < 0:
            raise PlacementError("cpu_milli and mem_mib must be >= 0")

    @property
    def gpus(self) -> float:
        return self.num_gpu * self.gpu_milli / MILLI if self.num_gpu else 0.0

    @property
    def fractional(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI


@dataclass(frozen=True)
class Placement:
    """Where a request landed: node row, GPU slots on it, and the MIG instance if any."""

    node: int
    gpus: tuple[int, ...]
    milli: int  # per GPU reserved; a MIG instance reserves its slices' share
    mig_start: int = -1
    mig_slices: int = 0  # 1..7 on MIG-capable GPUs (7 with start 0 = the whole GPU)

    mig_instance: bool = False  # a fractional request served as a MIG instance


def slice_mask(slices: int, start: int) -> int:
    return ((1 << slices) - 1) << start


def slice_milli(slices: int) -> int:
    return MILLI if slices >= MIG_SLICES else slices * MILLI // MIG_SLICES


def _mig_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fit[n, occ]: an n-slice instance fits; best_start[n, occ]; free_milli[occ]."""
    fit = np.zeros((MIG_SLICES + 1, _OCC_STATES), dtype=bool)
    best = np.full((MIG_SLICES + 1, _OCC_STATES), -1, dtype=np.int8)
    fit[0, :] = True
    for occ in range(_OCC_STATES):
        for n, starts in MIG_STARTS.items():
            fit[n, occ] = any(occ & slice_mask(n, s) == 0 for s in starts)
    for occ in range(_OCC_STATES):
        for n, starts in MIG_STARTS.items():
            free_starts = [s for s in starts if occ & slice_mask(n, s) == 0]
            if free_starts:
                # keep the largest flexibility for later instances: most placements left open
                best[n, occ] = max(free_starts, key=lambda s: (_open_placements(occ | slice_mask(n, s)), -s))
    free = np.array(
        [(MIG_SLICES - bin(o).count("1")) * MILLI // MIG_SLICES for o in range(_OCC_STATES)], dtype=np.int32
    )
    free[0] = MILLI
    return fit, best, free


def _copies_table() -> np.ndarray:
    """copies[n, occ]: how many n-slice instances still fit (earliest-start greedy is optimal
    for equal-size aligned instances)."""
    copies = np.zeros((MIG_SLICES + 1, _OCC_STATES), dtype=np.int32)
    for occ in range(_OCC_STATES):
        for n, starts in MIG_STARTS.items():
            used = occ
            for s in starts:
                if used & slice_mask(n, s) == 0:
                    used |= slice_mask(n, s)
                    copies[n, occ] += 1
    return copies


def _open_placements(occ: int) -> int:
    return sum(occ & slice_mask(n, s) == 0 for n, starts in MIG_STARTS.items() for s in starts)


MIG_FIT, MIG_BEST_START, MIG_FREE_MILLI = _mig_tables()
MIG_COPIES = _copies_table()


@dataclass
class ClusterCapacity:
    """Free capacity of a fleet. Rows are nodes, columns GPU slots (padded to the widest node)."""

    node_ids: tuple[str, ...]
    model_names: tuple[str, ...]
    model_code: np.ndarray  # (N,) int16, index into model_names
    present: np.ndarray  # (N, G) bool: the slot holds a GPU
    gpu_free: np.ndarray  # (N, G) int32 milli
    mig_occ: np.ndarray  # (N, G) int16 bitmask of used MIG slices (MIG-capable nodes)
    node_mig: np.ndarray  # (N,) bool
    domain: np.ndarray  # (N, G) int8 NVLink domain of the slot
    cpu_total: np.ndarray  # (N,) int64
    mem_total: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    schedulable: np.ndarray  # (N,) bool: ON and not cordoned
    model_mig_sizes: tuple[tuple[int, ...], ...] = ()  # per model code: allowed instance sizes
    _model_mask_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        node_ids: Sequence[str],
        models: Sequence[str],
        gpus: Sequence[int],
        cpu_milli: Sequence[int],
        mem_mib: Sequence[int],
        mig_sizes_by_model: Mapping[str, Sequence[int]] | None = None,
        nvlink_domain_by_model: Mapping[str, int] | None = None,
        schedulable: Sequence[bool] | None = None,
    ) -> "ClusterCapacity":
        n = len(node_ids)
        if not (len(models) == len(gpus) == len(cpu_milli) == len(mem_mib) == n):
            raise PlacementError("node arrays must all have one entry per node")
        if len(set(node_ids)) != n:
            raise PlacementError("node ids must be unique")
        gpu_count = np.asarray(gpus, dtype=np.int64)
        if n and (gpu_count.min() < 0 or gpu_count.max() > 16):
            raise PlacementError("GPUs per node must be in 0..16")
        width = max(int(gpu_count.max()) if n else 1, 1)
        model_names = tuple(dict.fromkeys(models))
        code_of = {name: i for i, name in enumerate(model_names)}
        mig_sizes = mig_sizes_by_model or {}
        domains = nvlink_domain_by_model or {}
        slots = np.arange(width)[None, :]
        present = slots < gpu_count[:, None]
        domain_size = np.array([max(int(domains.get(m, width)), 1) for m in models] or [1])[:n]
        node_mig = np.array([bool(mig_sizes.get(m)) for m in models], dtype=bool)
        return cls(
            node_ids=tuple(node_ids),
            model_names=model_names,
            model_code=np.array([code_of[m] for m in models], dtype=np.int16),
            present=present,
            gpu_free=np.where(present, MILLI, 0).astype(np.int32),
            mig_occ=np.zeros((n, width), dtype=np.int16),
            node_mig=node_mig,
            domain=(slots // domain_size[:, None]).astype(np.int8) if n else np.zeros((0, width), np.int8),
            cpu_total=np.asarray(cpu_milli, dtype=np.int64).copy(),
            mem_total=np.asarray(mem_mib, dtype=np.int64).copy(),
            cpu_free=np.asarray(cpu_milli, dtype=np.int64).copy(),
            mem_free=np.asarray(mem_mib, dtype=np.int64).copy(),
            schedulable=(
                np.ones(n, dtype=bool) if schedulable is None else np.asarray(schedulable, dtype=bool).copy()
            ),
            model_mig_sizes=tuple(tuple(sorted(mig_sizes.get(m, ()))) for m in model_names),
        )

    def copy(self) -> "ClusterCapacity":
        return ClusterCapacity(
            self.node_ids,
            self.model_names,
            self.model_code,
            self.present,
            self.gpu_free.copy(),
            self.mig_occ.copy(),
            self.node_mig,
            self.domain,
            self.cpu_total,
            self.mem_total,
            self.cpu_free.copy(),
            self.mem_free.copy(),
            self.schedulable.copy(),
            self.model_mig_sizes,
        )

    # -- views --------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def any_mig(self) -> bool:
        return bool(self.node_mig.any())

    def total_gpus(self, nodes: np.ndarray | None = None) -> float:
        present = self.present if nodes is None else self.present[nodes]
        return float(present.sum())

    def free_gpus(self, nodes: np.ndarray | None = None) -> float:
        free = self.gpu_free if nodes is None else self.gpu_free[nodes]
        return float(free.sum()) / MILLI

    def model_allowed(self, models: tuple[str, ...]) -> np.ndarray:
        """(N,) bool: the node's GPU model satisfies the request's model constraint."""
        cached = self._model_mask_cache.get(models)
        if cached is None:
            if not models:
                cached = np.ones(self.n_nodes, dtype=bool)
            else:
                codes = [i for i, name in enumerate(self.model_names) if name in models]
                cached = np.isin(self.model_code, np.array(codes, dtype=np.int16))
            self._model_mask_cache[models] = cached
        return cached

    def slices_needed(self, gpu_milli: int) -> np.ndarray:
        """(N,) int8: MIG slices an instance for `gpu_milli` takes on each node (0: not MIG)."""
        per_model = np.zeros(len(self.model_names), dtype=np.int8)
        for code, sizes in enumerate(self.model_mig_sizes):
            if sizes:
                per_model[code] = mig_slices_for(gpu_milli, sizes)
        return per_model[self.model_code]

    def gpu_fits(self, req: PodRequest) -> np.ndarray:
        """(N, G) bool: the slot can take one of the request's GPUs (fraction or whole)."""
        fits = self.present & (self.gpu_free >= req.gpu_milli)
        if self.any_mig and req.num_gpu:
            if req.gpu_milli >= MILLI:
                slices = np.full(self.n_nodes, MIG_SLICES, dtype=np.int64)
            else:
                slices = self.slices_needed(req.gpu_milli).astype(np.int64)
            mig_fit = MIG_FIT[slices[:, None], self.mig_occ] & self.present
            fits = np.where(self.node_mig[:, None], mig_fit, fits)
        return fits

    def feasible_nodes(self, req: PodRequest, fits: np.ndarray | None = None) -> np.ndarray:
        ok = (
            self.schedulable
            & self.model_allowed(req.models)
            & (self.cpu_free >= req.cpu_milli)
            & (self.mem_free >= req.mem_mib)
        )
        if req.num_gpu:
            fits = self.gpu_fits(req) if fits is None else fits
            ok &= fits.sum(axis=1) >= req.num_gpu
        return ok

    # -- mutation ------------------------------------------------------------------------
    def allocate(self, req: PodRequest, placement: Placement) -> None:
        """Reserve the placement; raise PlacementError rather than over-allocate anything."""
        n = placement.node
        self._check_slots(req, placement)
        if self.cpu_free[n] < req.cpu_milli or self.mem_free[n] < req.mem_mib:
            raise PlacementError(f"node {self.node_ids[n]}: not enough CPU/memory for the request")
        for g in placement.gpus:
            if self.node_mig[n]:
                mask = self._mig_mask(placement)
                if int(self.mig_occ[n, g]) & mask:
                    raise PlacementError(f"node {self.node_ids[n]} GPU {g}: MIG slices already in use")
                self.mig_occ[n, g] |= mask
                self.gpu_free[n, g] = MIG_FREE_MILLI[self.mig_occ[n, g]]
            else:
                if self.gpu_free[n, g] < placement.milli:
                    raise PlacementError(
                        f"node {self.node_ids[n]} GPU {g}: {placement.milli} milli requested, "
                        f"{self.gpu_free[n, g]} free"
                    )
                self.gpu_free[n, g] -= placement.milli
        self.cpu_free[n] -= req.cpu_milli
        self.mem_free[n] -= req.mem_mib

    def release(self, req: PodRequest, placement: Placement) -> None:
        n = placement.node
        self._check_slots(req, placement)
        for g in placement.gpus:
            if self.node_mig[n]:
                mask = self._mig_mask(placement)
                if int(self.mig_occ[n, g]) & mask != mask:
                    raise PlacementError(f"node {self.node_ids[n]} GPU {g}: releasing free MIG slices")
                self.mig_occ[n, g] &= ~mask
                self.gpu_free[n, g] = MIG_FREE_MILLI[self.mig_occ[n, g]]
            else:
                if self.gpu_free[n, g] + placement.milli > MILLI:
                    raise PlacementError(f"node {self.node_ids[n]} GPU {g}: releasing more than held")
                self.gpu_free[n, g] += placement.milli
        self.cpu_free[n] = min(self.cpu_free[n] + req.cpu_milli, self.cpu_total[n])
        self.mem_free[n] = min(self.mem_free[n] + req.mem_mib, self.mem_total[n])

    def _mig_mask(self, placement: Placement) -> int:
        starts = MIG_STARTS.get(placement.mig_slices, ())
        if placement.mig_start not in starts:
            raise PlacementError(
                f"node {self.node_ids[placement.node]}: MIG instance of {placement.mig_slices} "
                f"slices cannot start at slice {placement.mig_start}"
            )
        return slice_mask(placement.mig_slices, placement.mig_start)

    def _check_slots(self, req: PodRequest, placement: Placement) -> None:
        if not 0 <= placement.node < self.n_nodes:
            raise PlacementError(f"placement names node row {placement.node} of {self.n_nodes}")
        if len(placement.gpus) != req.num_gpu or len(set(placement.gpus)) != len(placement.gpus):
            raise PlacementError(
                f"placement gives {len(placement.gpus)} GPUs for a {req.num_gpu}-GPU request"
            )
        for g in placement.gpus:
            if not (0 <= g < self.present.shape[1] and self.present[placement.node, g]):
                raise PlacementError(f"node {self.node_ids[placement.node]} has no GPU slot {g}")


def mig_slices_for(gpu_milli: int, sizes: Sequence[int]) -> int:
    """Smallest allowed MIG instance whose compute share covers gpu_milli (7: the whole GPU)."""
    if gpu_milli >= MILLI:
        return MIG_SLICES
    need = -(-gpu_milli * MIG_SLICES // MILLI)
    for size in sorted(sizes):
        if size >= need:
            return size
    return MIG_SLICES
