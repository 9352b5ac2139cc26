"""The workload's typical pods: task classes and their popularity, the yardstick that
fragmentation is measured against (FGD's "target workload")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from market_pipeline.placement.capacity import (
    MIG_COPIES,
    MILLI,
    ClusterCapacity,
    PlacementError,
    PodRequest,
    mig_slices_for,
    slice_milli,
)


@dataclass(frozen=True)
class TypicalPods:
    """Task classes (num_gpu, gpu_milli, cpu_milli) and their weights (sum to 1)."""

    num_gpu: np.ndarray  # (K,) int64, 0 = CPU-only class
    gpu_milli: np.ndarray  # (K,) int64 per GPU (0 for CPU-only classes)
    cpu_milli: np.ndarray  # (K,) int64
    weight: np.ndarray  # (K,) float64

    @classmethod
    def from_requests(
        cls, requests: Iterable[PodRequest], coverage: float = 0.95, include_cpu_only: bool = True
    ) -> "TypicalPods":
        """Distinct (num_gpu, gpu_milli, cpu_milli), most popular first, kept until they
        cover `coverage` of the pods, then renormalised (as FGD's typical pods)."""
        if not 0 < coverage <= 1:
            raise PlacementError(f"coverage must be in (0, 1], got {coverage}")
        counts = Counter(
            (r.num_gpu, r.gpu_milli if r.num_gpu else 0, r.cpu_milli)
            for r in requests
            if include_cpu_only or r.num_gpu
        )
        if not counts:
            raise PlacementError("typical pods need at least one request")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        total = sum(counts.values())
        kept, covered = [], 0
        for key, count in ranked:
            kept.append((key, count))
            covered += count
            if covered >= coverage * total:
                break
        arr = np.array([k for k, _ in kept], dtype=np.int64)
        weight = np.array([c for _, c in kept], dtype=np.float64)
        return cls(arr[:, 0], arr[:, 1], arr[:, 2], weight / weight.sum())

    @property
    def size(self) -> int:
        return len(self.weight)

    @property
    def whole(self) -> np.ndarray:
        """(K,) bool: the class takes whole GPUs."""
        return (self.num_gpu > 0) & (self.gpu_milli >= MILLI)


@dataclass(frozen=True)
class ClassGeometry:
    """Per (class, GPU model): MIG slices a class GPU takes, GPU milli one copy reserves, and
    copies one fully free GPU holds. Built once per fleet layout."""

    slices: np.ndarray  # (K, M) int64, 0 off MIG models
    per_copy: np.ndarray  # (K, M) int64 milli
    copies_per_free_gpu: np.ndarray  # (K, M) int64

    @classmethod
    def build(cls, cap: ClusterCapacity, typical: TypicalPods) -> "ClassGeometry":
        k, m = typical.size, len(cap.model_names)
        slices = np.zeros((k, m), dtype=np.int64)
        per_copy = np.tile((typical.num_gpu * typical.gpu_milli)[:, None], (1, m))
        per_gpu = np.maximum(typical.gpu_milli, 1)
        copies = np.tile(np.where(typical.num_gpu > 0, MILLI // per_gpu, 0)[:, None], (1, m))
        for code, sizes in enumerate(cap.model_mig_sizes):
            if not sizes:
                continue
            for i, (n_gpu, milli) in enumerate(zip(typical.num_gpu, typical.gpu_milli)):
                if n_gpu == 0:
                    continue
                s = mig_slices_for(int(milli), sizes)
                slices[i, code] = s
                per_copy[i, code] = n_gpu * slice_milli(s)
                copies[i, code] = MIG_COPIES[s, 0] if milli < MILLI else 1
        return cls(slices, per_copy, copies)
