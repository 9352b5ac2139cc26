"""Read a Helios per-minute cluster file as a demand trace for replays.

Helios (Hu et al., SC 2021; github.com/S-Lab-System-Group/HeliosArtifact, MIT): one row a
minute; demand = running + pending GPUs; the pool starts at `total_gpu_num`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.lab.scaling.replay import DemandLoad

REQUIRED_COLUMNS = ("time", "running_gpu_num", "pending_gpu_num", "total_gpu_num")


# Ten million GPUs: far above any real cluster; a load claiming more is refused, not replayed.
MAX_LOAD_GPUS = 10_000_000


class LoadFileError(ValueError):
    """The demand file is missing, unreadable or has bad columns/values."""


def load_helios_demand(path: str | Path) -> DemandLoad:
    try:
        path = checked_file(path, "load file")
    except InputFileError as exc:
        raise LoadFileError(str(exc)) from None
    try:
        frame = pl.read_csv(path, columns=list(REQUIRED_COLUMNS), infer_schema_length=10000)
    except pl.exceptions.ColumnNotFoundError as exc:
        raise LoadFileError(
            f"{path}: needs columns {', '.join(REQUIRED_COLUMNS)} ({str(exc).strip().splitlines()[0][:160]})"
        ) from None
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise LoadFileError(f"{path}: unreadable as CSV ({str(exc).strip().splitlines()[0][:160]})") from None
    if frame.height == 0:
        raise LoadFileError(f"{path}: no rows")
    for column in REQUIRED_COLUMNS[1:]:
        values = frame[column]
        if not values.dtype.is_numeric():
            raise LoadFileError(f"{path}: column {column} is not numeric ({values.dtype})")
        if values.null_count():
            raise LoadFileError(f"{path}: column {column} has {values.null_count()} empty value(s)")
        if values.dtype.is_float() and not values.is_finite().all():
            raise LoadFileError(f"{path}: column {column} has values that are not finite numbers")
        if (values < 0).any():
            raise LoadFileError(f"{path}: column {column} has negative values")
        if (values > MAX_LOAD_GPUS).any():
            raise LoadFileError(
                f"{path}: column {column} has values above {MAX_LOAD_GPUS} GPUs (max {values.max():.3g});"
                " no replay fleet is that large"
            )
    demand = (frame["running_gpu_num"] + frame["pending_gpu_num"]).to_numpy().astype(float)
    try:
        start = dt.datetime.fromisoformat(str(frame["time"][0])).replace(tzinfo=dt.UTC)
    except ValueError:
        raise LoadFileError(f"{path}: column time, row 1: not an ISO timestamp") from None
    initial = int(frame["total_gpu_num"][0])
    if initial <= 0:
        raise LoadFileError(f"{path}: total_gpu_num in row 1 must be > 0")
    total = frame["total_gpu_num"].to_numpy().astype(int)
    return DemandLoad(
        demand=np.asarray(demand), start=start, initial_gpus=initial, source=str(path), total_gpus=total
    )
