"""The simulator's inputs as numpy tables: the fleet, the workload's job shapes and the load.

Fleet and shapes come from the simulated adapter's own model (`fleet.catalog`,
`fleet.shapes`): the same node-list reader, GPU model specs (NVLink domains, MIG sizes) and
pod-list reader (lifetime = deletion - scheduled time, at least a minute). The market
simulator keeps the trace's lifetimes uncapped (the twin caps them at three days to keep its
state small; here the long tail carries most of the GPU-hours). The load is a Helios
per-minute series: demand (running + pending GPUs) over capacity (total GPUs), several
virtual clusters summed into one.

Readers raise `SimulationInputError` naming the file and the problem. CPU-only pods are left
out (the market sells GPU time) and counted in `PodTable.excluded`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet.catalog import FleetCatalog, FleetSourceError, catalog_from_node_csv
from market_pipeline.fleet.shapes import QOS_VALUES, JobShapes, WorkloadError, load_openb_pods
from market_pipeline.fleet.workload import INFERENCE_SHARE_BY_QOS, WorkloadParams
from market_pipeline.gpus.models import GpuModelSpec, known_spec
from market_pipeline.lab.simulate.errors import SimulationInputError

LOAD_COLUMNS = ("time", "running_gpu_num", "pending_gpu_num", "total_gpu_num")
# Mean SM utilisation on a task's share in the twin's workload model (`fleet.workload`):
# inference Beta(2, 3), training Beta(6, 2), idle tasks uniform 0.5-8%.
INFERENCE_SM_MEAN, TRAINING_SM_MEAN, IDLE_SM_MEAN = 2.0 / 5.0, 6.0 / 8.0, 0.0425


@dataclass(frozen=True)
class FleetNodes:
    """GPU nodes of the fleet, one entry per node, and the specs of their GPU models."""

    node_ids: tuple[str, ...]
    models: tuple[str, ...]
    gpus: np.ndarray  # int64
    cpu_milli: np.ndarray
    mem_mib: np.ndarray
    specs: Mapping[str, GpuModelSpec] = field(default_factory=dict)
    source: str = ""

    @property
    def size(self) -> int:
        return len(self.node_ids)

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())

    def model_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.models))

    def spec(self, model: str) -> GpuModelSpec:
        return self.specs.get(model) or known_spec(model)

    @classmethod
    def from_catalog(cls, catalog: FleetCatalog) -> "FleetNodes":
        nodes = [n for n in catalog.nodes if n.gpus > 0]
        if not nodes:
            raise SimulationInputError(f"fleet {catalog.source}: no node has a GPU")
        return cls(
            tuple(n.node_id for n in nodes),
            tuple(n.gpu_model for n in nodes),
            np.array([n.gpus for n in nodes], dtype=np.int64),
            np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            np.array([n.memory_mib for n in nodes], dtype=np.int64),
            dict(catalog.models),
            catalog.source,
        )


@dataclass(frozen=True)
class PodTable:
    """GPU job shapes of the workload: what an arriving job looks like."""

    names: tuple[str, ...]
    num_gpu: np.ndarray  # int64, >= 1
    gpu_milli: np.ndarray  # per GPU, 1..1000 (1000 for multi-GPU pods)
    cpu_milli: np.ndarray
    mem_mib: np.ndarray
    qos: np.ndarray  # str
    runtime_s: np.ndarray  # float64
    gpu_spec: tuple[tuple[str, ...], ...]  # allowed GPU models per pod; () = any
    excluded: dict[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def gpus(self) -> np.ndarray:
        """GPUs each pod holds (fractional for a shared GPU)."""
        return self.num_gpu * self.gpu_milli / 1000.0

    @property
    def gpu_hours(self) -> np.ndarray:
        return self.gpus * self.runtime_s / 3600.0

    @classmethod
    def from_shapes(cls, shapes: JobShapes) -> "PodTable":
        gpu_rows = np.flatnonzero(shapes.num_gpu > 0)
        if gpu_rows.size == 0:
            raise SimulationInputError(f"workload {shapes.source}: no pod asks for a GPU")
        jobs = shapes.take(gpu_rows)
        qos = np.array(QOS_VALUES, dtype=object)[jobs.qos].astype(str)
        specs = tuple(tuple(m for m in str(s).split("|") if m) for s in jobs.gpu_spec)
        return cls(
            tuple(f"pod-{i:05d}" for i in gpu_rows),
            jobs.num_gpu.astype(np.int64),
            jobs.gpu_milli.astype(np.int64),
            jobs.cpu_milli.astype(np.int64),
            jobs.mem_mib.astype(np.int64),
            qos,
            jobs.lifetime_s.astype(np.float64),
            specs,
            {"cpu_only": int(len(shapes) - gpu_rows.size)},
            shapes.source,
        )


@dataclass(frozen=True)
class LoadProfile:
    """Demand relative to capacity over time (running + pending GPUs over total GPUs); NaN
    marks a gap in the trace (see `load_helios`)."""

    ratio: np.ndarray  # per step
    step_minutes: int
    source: str = ""

    @property
    def gap_steps(self) -> int:
        return int(np.isnan(self.ratio).sum())

    def factor(self) -> np.ndarray:
        """The load index: the ratio over its mean (gaps excluded), as the twin's Helios
        arrival profile scales its arrival rate."""
        if np.all(np.isnan(self.ratio)):
            raise SimulationInputError(f"load {self.source}: no step with data")
        mean = float(np.nanmean(self.ratio))
        if mean <= 0:
            raise SimulationInputError(f"load {self.source}: the demand is zero throughout")
        return self.ratio / mean

    def window(self, start_step: int, steps: int, lead_steps: int = 0) -> np.ndarray:
        """The load index over [start_step, start_step + steps); a gap there is an error that
        names the nearest `--load-start-day` whose window has none. The measured days start
        `lead_steps` (the warm-up) after the window does."""
        if start_step < 0 or start_step + steps > self.ratio.size:
            raise SimulationInputError(
                f"load {self.source}: window of {steps} steps from step {start_step} exceeds the "
                f"{self.ratio.size} steps of {self.step_minutes} min the series holds"
            )
        window = self.factor()[start_step : start_step + steps]
        if np.isnan(window).any():
            first = start_step + int(np.flatnonzero(np.isnan(window))[0])
            day = first * self.step_minutes / 1440.0
            raise SimulationInputError(
                f"load {self.source}: the trace has a gap at day {day:.2f} inside the "
                f"simulated window; {self._gap_free_start(start_step, steps, lead_steps)}"
            )
        return window

    def _gap_free_start(self, start_step: int, steps: int, lead_steps: int) -> str:
        """Where a window of `steps` has no gap, nearest `start_step`, as the advice of the gap's
        refusal: a whole day where one serves (ties go later), else the nearest step."""
        gaps = np.concatenate([[0], np.cumsum(np.isnan(self.ratio))])
        starts = np.arange(self.ratio.size - steps + 1)
        free = starts[gaps[starts + steps] == gaps[starts]]
        if free.size == 0:
            days = steps * self.step_minutes / 1440.0
            return f"no window of {days:g} days in the trace is free of gaps"
        per_day = 1440.0 / self.step_minutes
        measured = (free + lead_steps) / per_day  # each window's first measured day
        whole = free[np.isclose(measured, np.round(measured))]
        pool = whole if whole.size else free
        best = pool[np.lexsort((-pool, np.abs(pool - start_step)))[0]]
        return f"the nearest window without one: --load-start-day {(best + lead_steps) / per_day:g}"


def expected_sm_share(pods: PodTable) -> np.ndarray:
    """(P,) expected SM utilisation of each pod's GPU share, as the twin draws it: the QoS's
    inference share (multi-GPU pods train), its idle-task share, and the mean of each draw."""
    inference = np.array([INFERENCE_SHARE_BY_QOS.get(q, 0.0) for q in pods.qos]) * (pods.num_gpu == 1)
    idle = WorkloadParams().idle_task_share
    busy = inference * INFERENCE_SM_MEAN + (1.0 - inference) * TRAINING_SM_MEAN
    return (1.0 - idle) * busy + idle * IDLE_SM_MEAN


def load_nodes(path: str | Path, config: MarketPipelineConfig | None = None) -> FleetNodes:
    """A node list (openb or the spot trace's node_info_df), read by the fleet catalog."""
    try:
        return FleetNodes.from_catalog(catalog_from_node_csv(path, config))
    except FleetSourceError as exc:
        raise SimulationInputError(str(exc)) from None


def load_pods(path: str | Path) -> PodTable:
    """An openb pod list, read by the workload's shape reader."""
    try:
        return PodTable.from_shapes(load_openb_pods(path))
    except WorkloadError as exc:
        raise SimulationInputError(str(exc)) from None


def _numeric(frame: pl.DataFrame, column: str, path: Path) -> np.ndarray:
    values = frame[column]
    if not values.dtype.is_numeric():
        raise SimulationInputError(f"load {path}: column {column} is not numeric ({values.dtype})")
    if values.null_count():
        raise SimulationInputError(f"load {path}: column {column} has {values.null_count()} empty cells")
    array = values.cast(pl.Float64).to_numpy()
    if (array < 0).any() or not np.isfinite(array).all():
        raise SimulationInputError(f"load {path}: column {column} has negative or infinite values")
    return array


def _read_load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        checked_file(path, "load file")
    except InputFileError as exc:
        raise SimulationInputError(str(exc)) from None
    try:
        frame = pl.read_csv(path, infer_schema_length=20000)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise SimulationInputError(f"load file {path}: unreadable as CSV ({exc})") from None
    missing = [c for c in LOAD_COLUMNS if c not in frame.columns]
    if missing or frame.height == 0:
        raise SimulationInputError(
            f"load file {path}: needs rows and columns {list(LOAD_COLUMNS)} (missing {missing})"
        )
    demand = _numeric(frame, "running_gpu_num", path) + _numeric(frame, "pending_gpu_num", path)
    return demand, _numeric(frame, "total_gpu_num", path)


GAP_MINUTES = 360  # the summed demand at exactly zero for this long is a logging gap, not idleness


def _gaps(demand: np.ndarray) -> np.ndarray:
    """(minutes,) bool: inside a run of at least GAP_MINUTES minutes with zero demand."""
    zero = np.concatenate([[0], (demand == 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(zero))
    gap = np.zeros(demand.size, dtype=bool)
    for start, stop in zip(edges[0::2], edges[1::2]):
        if stop - start >= GAP_MINUTES:
            gap[start:stop] = True
    return gap


def load_helios(paths: Sequence[str | Path], step_minutes: int = 60) -> LoadProfile:
    """Helios per-minute files summed into one cluster: demand (running + pending GPUs) over
    capacity (total GPUs), averaged over `step_minutes`. Minutes where the summed demand is
    zero for six hours or more are a gap in the trace (Earth, 10 May 2020: every virtual
    cluster reads zero for the whole day) and read as missing (NaN), not as an idle cluster."""
    if not paths:
        raise SimulationInputError("load: no Helios file given")
    if step_minutes < 1 or 1440 % step_minutes:
        raise SimulationInputError(f"load step_minutes={step_minutes}: must divide a day")
    demand = capacity = None
    for raw in paths:
        d, c = _read_load(Path(raw))
        if demand is None or capacity is None:
            demand, capacity = d, c
        elif d.size != demand.size:
            raise SimulationInputError(f"load file {raw}: {d.size} rows, the first file has {demand.size}")
        else:
            demand, capacity = demand + d, capacity + c
    assert demand is not None and capacity is not None
    if (capacity <= 0).any():
        raise SimulationInputError(f"load {', '.join(map(str, paths))}: total_gpu_num is 0 in some minute")
    ratio = np.where(_gaps(demand), np.nan, demand / capacity)
    steps = ratio.size // step_minutes
    if steps == 0:
        raise SimulationInputError(f"load: fewer than {step_minutes} minutes of data")
    blocks = ratio[: steps * step_minutes].reshape(steps, step_minutes)
    seen = (~np.isnan(blocks)).sum(axis=1)
    per_step = np.where(seen > 0, np.nansum(blocks, axis=1) / np.maximum(seen, 1), np.nan)
    return LoadProfile(per_step, step_minutes, ", ".join(str(p) for p in paths))


def trace_files(data_dir: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(openb pod list, openb node list, Helios loads) under the shared traces folder; None
    (after printing the bench's one-line skip) where they are absent."""
    data = Path(data_dir)
    openb, helios = data / "alibaba-gpu-2023", data / "helios-earth"
    loads = tuple(sorted(str(p) for p in helios.glob("vc*.csv")))
    if not (openb / "openb_pod_list_default.csv").is_file() or not loads:
        print(json.dumps({"skipped": f"traces not found under {data}"}))
        return None
    return str(openb / "openb_pod_list_default.csv"), str(openb / "openb_node_list_gpu_node.csv"), loads
