"""Where a twin lives on disk: `<state>.json` (the commit point) and `<state>.d/` with
Parquet buffers: samples (one file per simulated hour, the last 48 h), task events and
ended tasks (the last 7 days).

Writes go Parquet first, JSON last, each via a temp file and an atomic rename. Buffer rows
carry the generation that wrote them; readers ignore rows newer than the JSON's
generation, so a crash between the two leaves a consistent view. The adapter serialises
processes that share the state with an advisory file lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from market_pipeline.bounded_input import MB, InputFileError, read_text_bounded
from market_pipeline.fleet.state import TwinStateError
from market_pipeline.hardware.protocol import SAMPLE_SCHEMA, TASK_EVENT_SCHEMA

SAMPLE_RETENTION_S = 48 * 3600
EVENT_RETENTION_S = 7 * 86_400
HOUR = 3600
GEN = "_generation"
# the twin's JSON state: nodes and tasks of a large fleet, far below this
MAX_STATE_BYTES = 512 * MB
_GENERATION = re.compile(r'^\{"version":\d+,"generation":(\d+),')

ENDED_SCHEMA: dict[str, pl.DataType] = {
    "task_id": pl.Utf8,
    "ended_ts": pl.Int64,
    "end_reason": pl.Utf8,
    "event": pl.Utf8,
    "tenant_id": pl.Utf8,
    "pool_id": pl.Utf8,
    "node_id": pl.Utf8,
    "gpu_uuids": pl.List(pl.Utf8),
    "gpu_milli": pl.Int64,
    "kind": pl.Utf8,
    "qos": pl.Utf8,
    "priority": pl.Int64,
    "resource_class": pl.Utf8,
    "started_ts": pl.Int64,
    "mem_mib": pl.Int64,
    "mig_profile": pl.Utf8,
    "do_not_drain": pl.Boolean,
    "checkpointable": pl.Boolean,
}


def _atomic_write(path: Path, write) -> None:  # noqa: ANN001 - write(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class TwinStore:
    def __init__(self, state_path: Path, sample_retention_s: int = SAMPLE_RETENTION_S) -> None:
        if sample_retention_s < HOUR:
            raise ValueError(f"the sample buffer must keep at least one hour, got {sample_retention_s}s")
        self.sample_retention_s = sample_retention_s
        self.state_path = state_path
        self.folder = state_path.parent / f"{state_path.stem}.d"
        self.samples_folder = self.folder / "samples"
        self.events_path = self.folder / "task_events.parquet"
        self.ended_path = self.folder / "ended_tasks.parquet"

    # -- JSON ------------------------------------------------------------------------------
    def read_state(self) -> dict[str, Any] | None:
        if not self.state_path.exists() and not self.state_path.is_symlink():
            return None
        try:
            text = read_text_bounded(self.state_path, "twin state", MAX_STATE_BYTES)
        except InputFileError as exc:
            if not self.state_path.exists():
                return None  # removed between the two looks
            raise TwinStateError(str(exc)) from None
        try:
            state = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TwinStateError(f"{self.state_path}: not valid JSON ({exc})") from None
        if not isinstance(state, dict):
            raise TwinStateError(f"{self.state_path}: expected a JSON object")
        return state

    def peek_generation(self) -> int | None:
        """The committed generation without parsing the whole state (it is written first)."""
        try:
            with open(self.state_path, "rb") as handle:
                head = handle.read(128).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:  # a directory where the state file belongs, no permission
            raise TwinStateError(f"{self.state_path}: cannot be read ({exc.strerror or exc})") from None
        match = _GENERATION.match(head)
        if match:
            return int(match.group(1))
        state = self.read_state()
        return int(state["generation"]) if state else None

    # -- writes ----------------------------------------------------------------------------
    def commit(
        self,
        state: dict[str, Any],
        samples: pl.DataFrame | None,
        events: Sequence[tuple[int, str, str, str, bool]],
        ended: Sequence[dict[str, Any]],
    ) -> None:
        """Write the buffers, then the JSON (the commit point) of generation state['generation']."""
        gen, epoch, clock = int(state["generation"]), int(state["epoch_ts"]), int(state["clock"])
        if samples is not None and samples.height:
            self._write_samples(samples.with_columns(pl.lit(gen, pl.Int64).alias(GEN)), epoch)
        self._prune_samples(epoch, clock, gen)
        if events:
            frame = pl.DataFrame(
                {
                    "ts": [e[0] * 1_000_000 for e in events],
                    "task_id": [e[1] for e in events],
                    "event": [e[2] for e in events],
                    "reason": [e[3] for e in events],
                    "platform_fault": [e[4] for e in events],
                },
                schema={**TASK_EVENT_SCHEMA, "ts": pl.Int64},
            ).with_columns(pl.col("ts").cast(pl.Datetime("us", "UTC")), pl.lit(gen, pl.Int64).alias(GEN))
            self._append(
                self.events_path, frame, pl.col("ts").dt.epoch("s") >= clock - EVENT_RETENTION_S, gen
            )
        if ended:
            frame = pl.DataFrame(list(ended), schema=ENDED_SCHEMA).with_columns(
                pl.lit(gen, pl.Int64).alias(GEN)
            )
            self._append(self.ended_path, frame, pl.col("ended_ts") >= clock - EVENT_RETENTION_S, gen)
        _atomic_write(self.state_path, lambda tmp: tmp.write_text(json.dumps(state, separators=(",", ":"))))

    def _read_committed(self, path: Path, gen: int) -> pl.DataFrame | None:
        if not path.exists():
            return None
        return pl.read_parquet(path).filter(pl.col(GEN) <= gen)

    def _append(self, path: Path, frame: pl.DataFrame, keep: pl.Expr, gen: int) -> None:
        old = self._read_committed(path, gen - 1)
        merged = frame if old is None else pl.concat([old, frame])
        merged = merged.filter(keep)
        _atomic_write(path, lambda tmp: merged.write_parquet(tmp))

    def _hour_file(self, hour: int) -> Path:
        return self.samples_folder / f"hour-{hour:07d}.parquet"

    def _write_samples(self, frame: pl.DataFrame, epoch: int) -> None:
        gen = int(frame[GEN][0])
        hours = frame.with_columns(((pl.col("ts").dt.epoch("s") - epoch) // HOUR).alias("_hour"))
        for (hour,), part in hours.group_by("_hour", maintain_order=True):
            path = self._hour_file(int(hour))
            old = self._read_committed(path, gen - 1)
            part = part.drop("_hour")
            merged = part if old is None else pl.concat([old, part])
            _atomic_write(path, lambda tmp: merged.write_parquet(tmp))

    def _prune_samples(self, epoch: int, clock: int, gen: int) -> None:
        if not self.samples_folder.exists():
            return
        oldest = (clock - self.sample_retention_s - epoch) // HOUR
        for path in self.samples_folder.glob("hour-*.parquet"):
            if int(path.stem.split("-")[1]) < oldest:
                path.unlink(missing_ok=True)

    # -- reads -----------------------------------------------------------------------------
    def retained_from(self, epoch: int, clock: int) -> int:
        """Earliest sample time still buffered."""
        return max(epoch, epoch + ((clock - self.sample_retention_s - epoch) // HOUR) * HOUR)

    def read_samples(self, start: int, end: int, epoch: int, gen: int) -> pl.DataFrame:
        first, last = (max(start, epoch) - epoch) // HOUR, (end - 1 - epoch) // HOUR
        parts = []
        for hour in range(first, last + 1):
            frame = self._read_committed(self._hour_file(hour), gen)
            if frame is not None:
                parts.append(frame)
        if not parts:
            return pl.DataFrame(schema=SAMPLE_SCHEMA)
        seconds = pl.col("ts").dt.epoch("s")
        out = pl.concat(parts).filter((seconds >= start) & (seconds < end))
        return out.drop(GEN).select(list(SAMPLE_SCHEMA)).cast(SAMPLE_SCHEMA)  # type: ignore[arg-type]

    def read_events(self, start: int, end: int, gen: int) -> pl.DataFrame:
        frame = self._read_committed(self.events_path, gen)
        if frame is None:
            return pl.DataFrame(schema=TASK_EVENT_SCHEMA)
        seconds = pl.col("ts").dt.epoch("s")
        window = frame.filter((seconds >= start) & (seconds < end)).drop(GEN).select(list(TASK_EVENT_SCHEMA))
        return window.sort("ts", maintain_order=True)

    def read_ended(self, task_ids: Sequence[str], gen: int) -> list[dict[str, Any]]:
        frame = self._read_committed(self.ended_path, gen)
        if frame is None or not task_ids:
            return []
        return frame.filter(pl.col("task_id").is_in(list(task_ids))).drop(GEN).to_dicts()
