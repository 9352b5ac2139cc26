"""GPU fragmentation measured against the workload, after FGD (Weng et al., "Beware of
Fragmentation", USENIX ATC'23).

For a task class m of the typical pods and a node n, two views of the free GPU capacity m
cannot use:

- single-pod (FGD's F_n(m)): if one pod of m cannot run on n at all (too few fitting GPUs,
  too little CPU, or m asks for no GPU) every free milli-GPU is a fragment; otherwise the
  free capacity of each GPU too small for m's per-GPU demand is;
- packing: the free milli-GPUs left after filling n with as many copies of m as its GPUs
  *and its CPU* allow. This extends FGD's one-pod look-ahead to the node's whole remaining
  capacity, so that spending a node's CPU next to idle GPUs counts as fragmentation before
  the last pod that could have used them is turned away.

F_n(M) = sum_m p_m [a * single + (1 - a) * packing]; a = 1 is FGD exactly. On the openb
trace, CPU is the binding resource at saturation (pods ask for 80% of the cluster's CPU),
and the packing view is what lets fragment_aware beat best_fit by a wide margin (see the
placement bench). Everything is vectorised over (classes x nodes x GPU slots);
`FragmentTerms` keeps the per-node terms between calls and recomputes only changed nodes.
"""

from __future__ import annotations

import numpy as np

from market_pipeline.placement.capacity import (
    MIG_BEST_START,
    MIG_COPIES,
    MIG_FIT,
    MIG_FREE_MILLI,
    MILLI,
    ClusterCapacity,
    PodRequest,
)
from market_pipeline.placement.typical import ClassGeometry, TypicalPods

DEFAULT_SINGLE_POD_WEIGHT = 0.25
_EPS = 1e-9


class FragmentTerms:
    """Per-node fragmentation terms kept in step with one ClusterCapacity.

    Hot paths use float64 arithmetic on exact small integers instead of np.where and
    integer division (several times faster on (classes x candidates) arrays); classes are
    kept with whole-GPU classes first so per-class branches become slices.
    """

    def __init__(self, typical: TypicalPods, single_pod_weight: float = DEFAULT_SINGLE_POD_WEIGHT) -> None:
        if not 0.0 <= single_pod_weight <= 1.0:
            raise ValueError(f"single_pod_weight must be in [0, 1], got {single_pod_weight}")
        order = np.argsort(~typical.whole, kind="stable")
        typical = TypicalPods(
            typical.num_gpu[order], typical.gpu_milli[order], typical.cpu_milli[order], typical.weight[order]
        )
        self.typical = typical
        self.alpha = single_pod_weight
        self._nw = int(typical.whole.sum())
        self._seen: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        col = (-1, 1)
        # CPU-only classes never "run" on a node's GPUs: give them an unreachable GPU count
        self._n_gpu = np.where(typical.num_gpu > 0, typical.num_gpu, 1 << 30).astype(np.float64).reshape(col)
        self._inv_n_gpu = (1.0 / np.maximum(typical.num_gpu, 1)).reshape(col)
        self._cpu = typical.cpu_milli.astype(np.float64).reshape(col)
        self._inv_cpu = np.where(typical.cpu_milli > 0, 1.0 / np.maximum(typical.cpu_milli, 1), 0.0).reshape(
            col
        )
        self._cpu_unbounded = np.where(typical.cpu_milli > 0, 0.0, 1e18).reshape(col)
        self._milli = np.maximum(typical.gpu_milli, 1).astype(np.float64).reshape(-1, 1, 1)
        self._inv_milli = 1.0 / self._milli

    # -- bookkeeping ----------------------------------------------------------------------
    def refresh(self, cap: ClusterCapacity) -> None:
        """Bring the terms up to date with `cap`, recomputing only nodes that changed."""
        seen = self._seen
        if seen is None or seen[0] != id(cap) or seen[1].shape != cap.gpu_free.shape:
            self._layout(cap)
            rows = np.arange(cap.n_nodes)
        else:
            changed = (
                (seen[1] != cap.gpu_free).any(axis=1)
                | (seen[2] != cap.mig_occ).any(axis=1)
                | (seen[3] != cap.cpu_free)
            )
            rows = np.flatnonzero(changed)
        if len(rows):
            self._recompute(cap, rows)
        self._seen = (id(cap), cap.gpu_free.copy(), cap.mig_occ.copy(), cap.cpu_free.copy())

    def _layout(self, cap: ClusterCapacity) -> None:
        k, n = self.typical.size, cap.n_nodes
        geom = ClassGeometry.build(cap, self.typical)
        self.slices = geom.slices[:, cap.model_code]  # (K, N)
        # float64 holds these integers exactly and keeps the candidate arithmetic cheap
        self.per_copy = geom.per_copy[:, cap.model_code].astype(np.float64)
        self.copies_per_free_gpu = geom.copies_per_free_gpu[:, cap.model_code].astype(np.float64)
        self.count = np.zeros((k, n))
        self.partial = np.zeros((k, n))
        self.copies = np.zeros((k, n))
        self.total = np.zeros(n)
        self.frag = np.zeros(n)

    def _recompute(self, cap: ClusterCapacity, rows: np.ndarray) -> None:
        free = np.where(cap.present[rows], cap.gpu_free[rows], -1).astype(np.float64)
        fits, copies = self._slot_terms(cap, rows, free, cap.mig_occ[rows])
        free0 = np.maximum(free, 0.0)
        self.count[:, rows] = fits.sum(axis=2)
        self.partial[:, rows] = (free0[None] * ~fits).sum(axis=2)
        self.copies[:, rows] = copies.sum(axis=2)
        self.total[rows] = free0.sum(axis=1)
        self.frag[rows] = self._value(
            rows,
            self.count[:, rows],
            self.partial[:, rows],
            self.copies[:, rows],
            self.total[rows],
            cap.cpu_free[rows],
        )

    def _slot_terms(
        self, cap: ClusterCapacity, rows: np.ndarray, free: np.ndarray, occ: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(K, R, S): whether a slot takes one class GPU, and how many class copies it holds
        (whole classes: 1 per free GPU). `free`/`occ` are (R, S) slot states, free<0 = no GPU."""
        present = (free >= 0)[None]
        fits = (free[None] >= self._milli) & present
        copies = np.floor(np.maximum(free, 0.0)[None] * self._inv_milli + _EPS)
        copies[: self._nw] = fits[: self._nw]
        if cap.any_mig and cap.node_mig[rows].any():
            mig_rows = cap.node_mig[rows][None, :, None]
            slices = self.slices[:, rows][:, :, None]
            occ3 = occ.astype(np.int64)[None]
            mig_fit = MIG_FIT[slices, occ3] & present
            mig_copies = (MIG_COPIES[slices, occ3] * present).astype(np.float64)
            mig_copies[: self._nw] = mig_fit[: self._nw]
            fits = np.where(mig_rows, mig_fit, fits)
            copies = np.where(mig_rows, mig_copies, copies)
        return fits, copies

    def _value(
        self,
        rows: np.ndarray | slice,
        count: np.ndarray,
        partial: np.ndarray,
        copies: np.ndarray,
        total: np.ndarray,
        cpu_free: np.ndarray,
    ) -> np.ndarray:
        """Expected fragmented milli per node (or per candidate) from class terms (K, R)."""
        cpu_free = np.asarray(cpu_free, dtype=np.float64)
        value = 0.0
        if self.alpha > 0:
            runs = (count >= self._n_gpu) & (cpu_free >= self._cpu)
            value = self.alpha * (total + runs * (partial - total))
        if self.alpha < 1:
            # floors of exact integer quotients; the epsilon absorbs float rounding
            by_cpu = np.floor(cpu_free * self._inv_cpu + _EPS) + self._cpu_unbounded
            by_gpu = copies.copy()
            by_gpu[: self._nw] = np.floor(count[: self._nw] * self._inv_n_gpu[: self._nw] + _EPS)
            # CPU-only classes have per_copy 0: their packed view is all the free GPU
            packed = total - np.minimum(by_gpu, by_cpu) * self.per_copy[:, rows]
            value = value + (1 - self.alpha) * packed
        return self.typical.weight @ value

    # -- queries --------------------------------------------------------------------------
    def node_fragmentation(self) -> np.ndarray:
        return self.frag.copy()

    def delta_whole(self, cap: ClusterCapacity, req: PodRequest, rows: np.ndarray) -> np.ndarray:
        """Growth of F_n(M) on `rows` if a CPU-only or whole-GPU request lands there. Whole GPUs
        are interchangeable: k of them remove k fitting slots (a free GPU fits every class),
        k free GPUs' worth of copies and k*1000 free milli, and leave partial sums alone."""
        if len(rows) * 2 > cap.n_nodes:  # scoring every node beats gathering most of them
            return self._delta_whole(cap, req, slice(None))[rows]
        return self._delta_whole(cap, req, rows)

    def _delta_whole(self, cap: ClusterCapacity, req: PodRequest, rows: np.ndarray | slice) -> np.ndarray:
        k = req.num_gpu
        after = self._value(
            rows,
            self.count[:, rows] - k,
            self.partial[:, rows],
            self.copies[:, rows] - k * self.copies_per_free_gpu[:, rows],
            self.total[rows] - k * MILLI,
            cap.cpu_free[rows] - req.cpu_milli,
        )
        return after - self.frag[rows]

    def delta_fraction(
        self, cap: ClusterCapacity, req: PodRequest, rows: np.ndarray, slots: np.ndarray
    ) -> np.ndarray:
        """Growth of F_n(M) if a fractional request takes slot `slots[i]` on node `rows[i]`."""
        free = cap.gpu_free[rows, slots].astype(np.float64)
        occ = cap.mig_occ[rows, slots]
        free_after, occ_after = slot_after_fraction(cap, req, rows, free, occ)
        fits_b, copies_b = self._slot_terms(cap, rows, free[:, None], occ[:, None])
        fits_a, copies_a = self._slot_terms(cap, rows, free_after[:, None], occ_after[:, None])
        fits_b, copies_b, fits_a, copies_a = (
            fits_b[:, :, 0],
            copies_b[:, :, 0],
            fits_a[:, :, 0],
            copies_a[:, :, 0],
        )
        count = self.count[:, rows] + fits_a - fits_b.astype(np.float64)
        partial = self.partial[:, rows] - free[None] * ~fits_b + free_after[None] * ~fits_a
        copies = self.copies[:, rows] - copies_b + copies_a
        total = self.total[rows] - (free - free_after)
        after = self._value(rows, count, partial, copies, total, cap.cpu_free[rows] - req.cpu_milli)
        return after - self.frag[rows]


def slot_after_fraction(
    cap: ClusterCapacity, req: PodRequest, rows: np.ndarray, free: np.ndarray, occ: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Free milli and MIG occupancy of each slot if the fractional request took it."""
    free_after = free - req.gpu_milli
    occ_after = occ
    if cap.any_mig:
        mig_rows = cap.node_mig[rows]
        if mig_rows.any():
            slices = cap.slices_needed(req.gpu_milli).astype(np.int64)[rows]
            start = MIG_BEST_START[slices, occ].astype(np.int64)
            masks = np.where(start >= 0, ((1 << slices) - 1) << np.maximum(start, 0), 0)
            occ_after = np.where(mig_rows, occ | masks, occ).astype(np.int16)
            free_after = np.where(mig_rows, MIG_FREE_MILLI[occ_after], free_after).astype(free.dtype)
    return free_after, occ_after


def node_fragmentation(
    cap: ClusterCapacity, typical: TypicalPods, single_pod_weight: float = DEFAULT_SINGLE_POD_WEIGHT
) -> np.ndarray:
    """(N,) expected fragmented milli-GPUs per node, F_n(M)."""
    terms = FragmentTerms(typical, single_pod_weight)
    terms.refresh(cap)
    return terms.node_fragmentation()


def cluster_fragmentation(
    cap: ClusterCapacity,
    typical: TypicalPods,
    nodes: np.ndarray | None = None,
    single_pod_weight: float = DEFAULT_SINGLE_POD_WEIGHT,
) -> dict[str, float]:
    """Fragmented GPUs (the blend fragment_aware minimises, and both views alone), free GPUs
    and the blend's share of them; over all nodes or the given ones."""
    select = slice(None) if nodes is None else nodes
    free_gpus = float(cap.gpu_free[select].sum()) / MILLI
    views = {
        "fragmented_gpus": single_pod_weight,
        "fgd_fragmented_gpus": 1.0,
        "packing_fragmented_gpus": 0.0,
    }
    out = {
        name: float(node_fragmentation(cap, typical, a)[select].sum()) / MILLI for name, a in views.items()
    }
    out["free_gpus"] = free_gpus
    out["fragmentation_ratio"] = out["fragmented_gpus"] / free_gpus if free_gpus else 0.0
    return out


def mig_start_for(cap: ClusterCapacity, node: int, slot: int, slices: int) -> int:
    """The slice an n-slice instance should start at on this GPU (-1: it does not fit)."""
    return int(MIG_BEST_START[slices, int(cap.mig_occ[node, slot])])
