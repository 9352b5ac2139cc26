"""Arrival profiles: how busy the fleet is asked to be over time, as a multiplier with
mean about 1 on the workload's target utilisation.

- `diurnal`: 1 + A cos(2 pi (hour - peak) / 24), hour in UTC (default peak 06:00 UTC,
  14:00 in China where the configured zones are);
- a Helios per-minute series (SenseTime "Earth", Hu et al. SC'21): demand = running +
  pending GPUs, divided by its mean, replayed cyclically from the twin's epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.fleet.shapes import WorkloadError

HELIOS_COLUMNS = ("time", "running_gpu_num", "pending_gpu_num")


@dataclass(frozen=True)
class ArrivalProfile:
    """factor(t) for t in seconds since the twin's epoch (a midnight UTC)."""

    kind: str  # "diurnal" | "helios"
    amplitude: float = 0.3
    peak_hour_utc: float = 6.0
    series: np.ndarray | None = None  # per-minute factors for "helios"
    source: str = "diurnal"

    def factor(self, seconds_since_epoch: np.ndarray) -> np.ndarray:
        t = np.asarray(seconds_since_epoch, dtype=np.float64)
        if self.kind == "helios":
            assert self.series is not None
            minute = (t // 60).astype(np.int64) % len(self.series)
            return self.series[minute]
        hour = (t / 3600.0) % 24.0
        return 1.0 + self.amplitude * np.cos(2.0 * math.pi * (hour - self.peak_hour_utc) / 24.0)


def diurnal_profile(amplitude: float = 0.3, peak_hour_utc: float = 6.0) -> ArrivalProfile:
    if not 0.0 <= amplitude < 1.0:
        raise WorkloadError(f"diurnal amplitude must be in [0, 1), got {amplitude}")
    return ArrivalProfile("diurnal", amplitude, peak_hour_utc % 24.0)


def helios_profile(path: str | Path) -> ArrivalProfile:
    """A Helios virtual cluster's per-minute demand (running + pending GPUs) over its mean."""
    path = Path(path)
    try:
        checked_file(path, "Helios series")
    except InputFileError as exc:
        raise WorkloadError(str(exc)) from None
    try:
        frame = pl.read_csv(path, columns=list(HELIOS_COLUMNS))
    except FileNotFoundError:
        raise WorkloadError(f"Helios series {path} does not exist") from None
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise WorkloadError(
            f"Helios series {path}: cannot read columns {list(HELIOS_COLUMNS)}: {exc}"
        ) from None
    demand = (frame["running_gpu_num"] + frame["pending_gpu_num"]).cast(pl.Float64)
    if demand.null_count() or len(demand) == 0:
        raise WorkloadError(f"Helios series {path}: demand columns are empty or have gaps")
    values = demand.to_numpy()
    if (values < 0).any() or values.mean() <= 0:
        raise WorkloadError(f"Helios series {path}: demand must be non-negative with a positive mean")
    return ArrivalProfile("helios", series=values / values.mean(), source=str(path))


def arrival_profile(
    source: str, amplitude: float = 0.3, peak_hour_utc: float = 6.0, resolve=Path
) -> ArrivalProfile:  # noqa: ANN001 - a path resolver
    """'diurnal' or a path to a Helios per-minute CSV."""
    if source == "diurnal":
        return diurnal_profile(amplitude, peak_hour_utc)
    return helios_profile(resolve(source))
