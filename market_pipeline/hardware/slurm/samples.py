"""Per-GPU allocation samples of the slurm backend, kept so that a closed hour can be read.

Slurm keeps no history of who held which GPU, and the telemetry job reads an hour after it
closed. So each time the adapter reads the cluster (`list_tasks`, at most once per
`interval_seconds`) it appends one sample per GPU to a JSON-lines file next to its journal;
`read_samples(start, end)` returns the logged samples in the window. Bounded: reads look at
the last `max_bytes` of the file, which is cut to its newer half once it passes that size.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from market_pipeline.hardware.protocol import SAMPLE_SCHEMA

MAX_BYTES = 64 * 1024 * 1024


class SampleLog:
    def __init__(self, path: Path, interval_seconds: float = 60.0, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.interval_seconds = interval_seconds
        self.max_bytes = max_bytes

    def due(self, now: datetime) -> bool:
        """Whether the newest logged sample is older than the interval (or there is none)."""
        last = self._last_ts()
        return last is None or (now - last).total_seconds() >= self.interval_seconds

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        lines = "".join(json.dumps({**row, "ts": row["ts"].isoformat()}) + "\n" for row in rows)
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(lines)
            handle.flush()
            if handle.tell() > self.max_bytes:
                self._halve()

    def read(self, start: datetime, end: datetime) -> pl.DataFrame:
        rows = []
        for record in self._records():
            ts = datetime.fromisoformat(record["ts"])
            if start <= ts < end:
                rows.append({**record, "ts": ts})
        return pl.DataFrame(rows, schema=SAMPLE_SCHEMA).sort("ts", "gpu_uuid")

    def _records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(max(0, size - self.max_bytes))
                data = handle.read()
        except FileNotFoundError:
            return []
        out = []
        for line in data.decode(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # the first line of a tail read, or a torn last line
        return out

    def _last_ts(self) -> datetime | None:
        try:
            with open(self.path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(max(0, size - 4096))
                tail = handle.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(tail):
            try:
                return datetime.fromisoformat(json.loads(line)["ts"])
            except (ValueError, KeyError):
                continue
        return None

    def _halve(self) -> None:
        data = self.path.read_bytes()
        keep = data[len(data) // 2 :]
        keep = keep[keep.find(b"\n") + 1 :]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(keep)
        os.replace(tmp, self.path)
