"""Job shapes: what a pod asks for and how long it lives, from an openb pod list or from a
small built-in distribution (so the project runs without ../shared).

The built-in distribution is a summary of Alibaba PAI's openb trace
(`openb_pod_list_default.csv`, 7,064 GPU pods; Weng et al., ATC'23):

- GPU shape: 43.6% fractional single-GPU (44% of single-GPU pods), 55.4% one whole GPU,
  0.23% two, 0.21% four, 0.62% eight whole GPUs; fractional `gpu_milli` values with their
  trace counts (810 milli is the most common, then 470, 320, 650);
- QoS per shape: fractional 75% BE / 25% LS; one GPU 82% LS, 16% BE, 2% Burstable, 0.15%
  Guaranteed; multi-GPU mostly LS with Burstable (8-GPU: 52% LS, 48% Burstable);
- lifetime (deletion - scheduled) log-normal per QoS: BE median 5.6 min, LS 12.5 min,
  Burstable 45 min, Guaranteed 4.5 h, log-sd 1.9-3.9 (heavy tails; capped by the workload);
- host CPU / memory per GPU: fractional 4 cores / 15 GiB, whole 11.4 cores / 47 GiB,
  multi-GPU 8-11 cores / 32-40 GiB (medians; log-normal spread 0.35).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.placement.capacity import MILLI, PodRequest

QOS_VALUES: tuple[str, ...] = ("LS", "BE", "Burstable", "Guaranteed")
MIN_LIFETIME_S = 60  # a pod lives at least one default sample interval
OPENB_POD_COLUMNS = (
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)

# (num_gpu, fractional?) -> share of GPU pods
_SHAPE_SHARES: tuple[tuple[int, bool, float], ...] = (
    (1, True, 0.4357),
    (1, False, 0.5537),
    (2, False, 0.0023),
    (4, False, 0.0021),
    (8, False, 0.0062),
)
_FRACTIONAL_MILLI: dict[int, int] = {
    50: 7,
    110: 24,
    140: 1,
    160: 74,
    220: 62,
    230: 140,
    270: 4,
    290: 1,
    320: 328,
    330: 7,
    350: 6,
    370: 47,
    440: 2,
    460: 128,
    470: 750,
    480: 19,
    550: 72,
    590: 75,
    650: 253,
    810: 1078,
}
# shape key -> QoS shares in QOS_VALUES order (LS, BE, Burstable, Guaranteed)
_QOS_MIX: dict[str, tuple[float, float, float, float]] = {
    "frac": (0.247, 0.753, 0.0, 0.0),
    "1": (0.8182, 0.1608, 0.0194, 0.0016),
    "2": (0.9375, 0.0, 0.0625, 0.0),
    "4": (0.9333, 0.0, 0.0667, 0.0),
    "8": (0.5227, 0.0, 0.4773, 0.0),
}
# QoS -> (log-mean, log-sd) of lifetime in seconds
_LIFETIME_LOGNORMAL: dict[str, tuple[float, float]] = {
    "LS": (6.62, 1.89),
    "BE": (5.82, 1.90),
    "Burstable": (7.91, 3.16),
    "Guaranteed": (9.69, 3.91),
}
# shape key -> (CPU milli per GPU, memory MiB per GPU) medians
_HOST_PER_GPU: dict[str, tuple[int, int]] = {
    "frac": (4000, 15258),
    "1": (11400, 48128),
    "2": (8100, 33280),
    "4": (8050, 33024),
    "8": (11000, 40960),
}


class WorkloadError(ValueError):
    """A workload source cannot be read or holds an impossible job; the message names it."""


@dataclass(frozen=True)
class JobShapes:
    """Columnar job shapes, one row per pod of the source, in source order."""

    num_gpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64 per GPU (0 for CPU-only pods)
    cpu_milli: np.ndarray  # int64
    mem_mib: np.ndarray  # int64
    qos: np.ndarray  # int8 index into QOS_VALUES
    gpu_spec: np.ndarray  # object: "" or "V100M32|V100M16"
    lifetime_s: np.ndarray  # int64
    source: str

    def __len__(self) -> int:
        return len(self.num_gpu)

    def take(self, rows: np.ndarray) -> "JobShapes":
        return JobShapes(
            self.num_gpu[rows],
            self.gpu_milli[rows],
            self.cpu_milli[rows],
            self.mem_mib[rows],
            self.qos[rows],
            self.gpu_spec[rows],
            self.lifetime_s[rows],
            self.source,
        )

    def gpu_jobs(self) -> "JobShapes":
        """Only the shapes that ask for GPUs (the GPU fleet's workload)."""
        return self.take(np.flatnonzero(self.num_gpu > 0))

    def request(self, row: int) -> PodRequest:
        spec = str(self.gpu_spec[row])
        return PodRequest(
            num_gpu=int(self.num_gpu[row]),
            gpu_milli=int(self.gpu_milli[row]),
            cpu_milli=int(self.cpu_milli[row]),
            mem_mib=int(self.mem_mib[row]),
            models=tuple(m for m in spec.split("|") if m),
        )

    def to_requests(self) -> list[PodRequest]:
        return [self.request(i) for i in range(len(self))]

    @property
    def gpus(self) -> np.ndarray:
        return self.num_gpu * self.gpu_milli / MILLI


def _read_pod_csv(path: Path) -> pl.DataFrame:
    try:
        checked_file(path, "pod list")
    except InputFileError as exc:
        raise WorkloadError(str(exc)) from None
    try:
        frame = pl.read_csv(
            path, infer_schema_length=10_000, schema_overrides={"gpu_spec": pl.Utf8, "qos": pl.Utf8}
        )
    except FileNotFoundError:
        raise WorkloadError(f"pod list {path} does not exist") from None
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise WorkloadError(f"pod list {path} cannot be read as CSV: {exc}") from None
    missing = [c for c in OPENB_POD_COLUMNS if c not in frame.columns]
    if missing:
        raise WorkloadError(f"pod list {path}: missing columns {missing}")
    return frame


def _ints(frame: pl.DataFrame, column: str, path: Path, nullable: bool = False) -> np.ndarray:
    try:
        values = frame[column].cast(pl.Int64, strict=True)
    except pl.exceptions.PolarsError:
        raise WorkloadError(f"pod list {path}: column {column!r} must hold integers") from None
    if not nullable and values.null_count():
        raise WorkloadError(f"pod list {path}: column {column!r} has {values.null_count()} empty cells")
    return values.to_numpy()


def load_openb_pods(path: str | Path) -> JobShapes:
    """Job shapes from an openb pod list; lifetime = deletion - scheduled (- creation when the
    pod never got scheduled), at least MIN_LIFETIME_S."""
    path = Path(path)
    frame = _read_pod_csv(path)
    num_gpu = _ints(frame, "num_gpu", path)
    gpu_milli = np.where(num_gpu > 0, _ints(frame, "gpu_milli", path), 0)
    bad = np.flatnonzero(
        (num_gpu < 0)
        | ((num_gpu > 0) & ((gpu_milli <= 0) | (gpu_milli > MILLI)))
        | ((num_gpu > 1) & (gpu_milli != MILLI))
    )
    if len(bad):
        raise WorkloadError(
            f"pod list {path}: row {int(bad[0]) + 2} has an impossible GPU request "
            f"(num_gpu={num_gpu[bad[0]]}, gpu_milli={gpu_milli[bad[0]]})"
        )
    qos_text = frame["qos"].fill_null("").to_list()
    unknown = sorted(set(qos_text) - set(QOS_VALUES))
    if unknown:
        raise WorkloadError(f"pod list {path}: unknown qos values {unknown}; expected {list(QOS_VALUES)}")
    created = _ints(frame, "creation_time", path)
    deleted = _ints(frame, "deletion_time", path)
    scheduled = _ints(frame, "scheduled_time", path, nullable=True)
    start = np.where(frame["scheduled_time"].is_null().to_numpy(), created, scheduled)
    return JobShapes(
        num_gpu=num_gpu.astype(np.int64),
        gpu_milli=gpu_milli.astype(np.int64),
        cpu_milli=_ints(frame, "cpu_milli", path).astype(np.int64),
        mem_mib=_ints(frame, "memory_mib", path).astype(np.int64),
        qos=np.array([QOS_VALUES.index(q) for q in qos_text], dtype=np.int8),
        gpu_spec=np.array(frame["gpu_spec"].fill_null("").to_list(), dtype=object),
        lifetime_s=np.maximum(deleted - start, MIN_LIFETIME_S).astype(np.int64),
        source=str(path),
    )


def builtin_shapes(rng: np.random.Generator, size: int = 4000) -> JobShapes:
    """`size` GPU job shapes drawn from the shipped openb summary (module docstring)."""
    if size < 1:
        raise WorkloadError(f"builtin workload size must be >= 1, got {size}")
    shares = np.array([s for _, _, s in _SHAPE_SHARES])
    kind = rng.choice(len(_SHAPE_SHARES), size=size, p=shares / shares.sum())
    num_gpu = np.array([_SHAPE_SHARES[k][0] for k in kind], dtype=np.int64)
    fractional = np.array([_SHAPE_SHARES[k][1] for k in kind])
    milli_values = np.array(list(_FRACTIONAL_MILLI))
    milli_weights = np.array(list(_FRACTIONAL_MILLI.values()), dtype=float)
    gpu_milli = np.where(
        fractional, rng.choice(milli_values, size=size, p=milli_weights / milli_weights.sum()), MILLI
    ).astype(np.int64)
    keys = np.where(fractional, "frac", num_gpu.astype(str))
    qos = np.empty(size, dtype=np.int8)
    cpu = np.empty(size, dtype=np.int64)
    mem = np.empty(size, dtype=np.int64)
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        mix = np.array(_QOS_MIX[str(key)])
        qos[rows] = rng.choice(len(QOS_VALUES), size=len(rows), p=mix / mix.sum())
        cpu_per_gpu, mem_per_gpu = _HOST_PER_GPU[str(key)]
        spread = rng.lognormal(0.0, 0.35, size=(2, len(rows)))
        cpu[rows] = np.maximum(np.round(cpu_per_gpu * spread[0] / 100) * 100, 500) * num_gpu[rows]
        mem[rows] = np.maximum(np.round(mem_per_gpu * spread[1] / 256) * 256, 1024) * num_gpu[rows]
    lifetime = np.empty(size, dtype=np.int64)
    for code, name in enumerate(QOS_VALUES):
        rows = np.flatnonzero(qos == code)
        mu, sigma = _LIFETIME_LOGNORMAL[name]
        lifetime[rows] = np.maximum(rng.lognormal(mu, sigma, size=len(rows)), MIN_LIFETIME_S)
    return JobShapes(num_gpu, gpu_milli, cpu, mem, qos, np.full(size, "", dtype=object), lifetime, "builtin")


def load_shapes(source: str, rng: np.random.Generator, resolve: Callable[[str], Path] = Path) -> JobShapes:
    """'builtin' or a path to an openb pod list."""
    if source == "builtin":
        return builtin_shapes(rng)
    return load_openb_pods(resolve(source))
