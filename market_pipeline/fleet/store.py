"""Where a twin lives on disk: `<state>.json` (the commit point) and `<state>.d/` with
Parquet buffers: samples (one file per simulated hour, the last 48 h), task events and
ended tasks (the last 7 days).

Writes go Parquet first, JSON last, each via a temp file and an atomic rename. Buffer rows
carry the generation that wrote them; readers ignore rows newer than the JSON's
generation, so a crash between the two leaves a consistent view. The adapter serialises
processes that share the state with an advisory file lock.

The same named blobs can live elsewhere (`Blobs`): on the cluster profile
(`[adapter] state_store = "control"`) they are rows of the control PostgreSQL, written in one
transaction per commit, and the lock is a PostgreSQL advisory lock, so any worker on any
machine reads and moves one twin.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from market_pipeline.bounded_input import MB, InputFileError, read_text_bounded
from market_pipeline.file_lock import exclusive_lock
from market_pipeline.fleet.state import TwinStateError
from market_pipeline.hardware.protocol import SAMPLE_SCHEMA, TASK_EVENT_SCHEMA

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

SAMPLE_RETENTION_S = 48 * 3600
EVENT_RETENTION_S = 7 * 86_400
HOUR = 3600
GEN = "_generation"
# the twin's JSON state: nodes and tasks of a large fleet, far below this
MAX_STATE_BYTES = 512 * MB
_GENERATION = re.compile(r'^\{"version":\d+,"generation":(\d+),')
SAMPLES = "samples/"
EVENTS = "task_events.parquet"
ENDED = "ended_tasks.parquet"

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


STATE = "state.json"  # the commit point's name among a twin's blobs


class Blobs(Protocol):
    """Where a twin's named blobs live: `STATE` (the JSON) and its Parquet buffers
    (`samples/hour-N.parquet`, `task_events.parquet`, `ended_tasks.parquet`)."""

    def get(self, name: str, head: int | None = None) -> bytes | None: ...

    def put(self, blobs: Sequence[tuple[str, bytes | None]]) -> None:
        """Write (name, body) pairs in order (None deletes); the last is the commit point."""
        ...

    def names(self, prefix: str) -> list[str]: ...

    def lock(self, wait_seconds: float) -> contextlib.AbstractContextManager[None]:
        """Hold the twin's writer lock (TimeoutError or a LockBusy after wait_seconds)."""
        ...

    def describe(self) -> str: ...


class FileBlobs:
    """The embedded default: `<state>.json` and `<state>.d/`, each file written to a temp file
    and renamed; the lock is an `flock` on `<state>.json.lock`."""

    def __init__(self, state_path: Path) -> None:
        self.state_path = state_path
        self.folder = state_path.parent / f"{state_path.stem}.d"

    def path(self, name: str) -> Path:
        return self.state_path if name == STATE else self.folder / name

    def get(self, name: str, head: int | None = None) -> bytes | None:
        path = self.path(name)
        try:
            if head is not None:
                with open(path, "rb") as handle:
                    return handle.read(head)
            if name == STATE:
                return read_text_bounded(path, "twin state", MAX_STATE_BYTES).encode()
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except InputFileError as exc:
            if not path.exists():
                return None  # removed between the two looks
            raise TwinStateError(str(exc)) from None
        except OSError as exc:  # a directory where the state file belongs, no permission
            raise TwinStateError(f"{path}: cannot be read ({exc.strerror or exc})") from None

    def put(self, blobs: Sequence[tuple[str, bytes | None]]) -> None:
        for name, body in blobs:
            path = self.path(name)
            if body is None:
                path.unlink(missing_ok=True)
            else:
                _atomic_write(path, lambda tmp, body=body: tmp.write_bytes(body))

    def names(self, prefix: str) -> list[str]:
        folder = self.folder / prefix.rsplit("/", 1)[0] if "/" in prefix else self.folder
        if not folder.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.folder))
            for p in folder.iterdir()
            if str(p.relative_to(self.folder)).startswith(prefix)
        )

    def lock(self, wait_seconds: float) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(
            self.state_path.with_name(self.state_path.name + ".lock"),
            wait_seconds,
            lambda: TimeoutError(f"fleet state {self.state_path} stayed locked for {wait_seconds:g}s"),
        )

    def describe(self) -> str:
        return str(self.state_path)


def _parquet(frame: pl.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return buffer.getvalue()


def configured_blobs(config: MarketPipelineConfig, *, migrate: bool = True) -> Blobs | None:
    """The twin's blobs in the control PostgreSQL when `[adapter] state_store = "control"`, keyed
    by the configured state path (the control schema made first with `migrate`); None: files."""
    if config.adapter.state_store != "control":
        return None
    from market_pipeline.warehouse.control import ControlBlobs, ControlStore

    control = ControlStore(config.control_url, config.control.schema_name)
    if migrate:
        control.migrate()
    return ControlBlobs(control, config.adapter.state_path)


class TwinStore:
    def __init__(
        self, state_path: Path, sample_retention_s: int = SAMPLE_RETENTION_S, blobs: Blobs | None = None
    ) -> None:
        if sample_retention_s < HOUR:
            raise ValueError(f"the sample buffer must keep at least one hour, got {sample_retention_s}s")
        self.sample_retention_s = sample_retention_s
        self.state_path = state_path
        self.blobs: Blobs = blobs if blobs is not None else FileBlobs(state_path)
        self.where = self.blobs.describe()

    # -- JSON ------------------------------------------------------------------------------
    def read_state(self) -> dict[str, Any] | None:
        body = self.blobs.get(STATE)
        if body is None:
            return None
        if len(body) > MAX_STATE_BYTES:
            raise TwinStateError(f"{self.where}: the twin state is over {MAX_STATE_BYTES // MB} MB")
        try:
            state = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TwinStateError(f"{self.where}: not valid JSON ({exc})") from None
        if not isinstance(state, dict):
            raise TwinStateError(f"{self.where}: expected a JSON object")
        return state

    def peek_generation(self) -> int | None:
        """The committed generation without parsing the whole state (it is written first)."""
        head = self.blobs.get(STATE, head=128)
        if head is None:
            return None
        match = _GENERATION.match(head.decode("utf-8", errors="replace"))
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
        hours: list[tuple[str, bytes | None]] = []
        if samples is not None and samples.height:
            hours = self._write_samples(samples.with_columns(pl.lit(gen, pl.Int64).alias(GEN)), epoch)
        writes = self._prune_samples(hours, epoch, clock)
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
            writes.append(
                self._append(EVENTS, frame, pl.col("ts").dt.epoch("s") >= clock - EVENT_RETENTION_S, gen)
            )
        if ended:
            frame = pl.DataFrame(list(ended), schema=ENDED_SCHEMA).with_columns(
                pl.lit(gen, pl.Int64).alias(GEN)
            )
            writes.append(self._append(ENDED, frame, pl.col("ended_ts") >= clock - EVENT_RETENTION_S, gen))
        writes.append((STATE, json.dumps(state, separators=(",", ":")).encode()))
        self.blobs.put(writes)

    def _read_committed(self, name: str, gen: int) -> pl.DataFrame | None:
        body = self.blobs.get(name)
        if body is None:
            return None
        return pl.read_parquet(io.BytesIO(body)).filter(pl.col(GEN) <= gen)

    def _append(self, name: str, frame: pl.DataFrame, keep: pl.Expr, gen: int) -> tuple[str, bytes]:
        old = self._read_committed(name, gen - 1)
        merged = frame if old is None else pl.concat([old, frame])
        return name, _parquet(merged.filter(keep))

    @staticmethod
    def _hour_name(hour: int) -> str:
        return f"{SAMPLES}hour-{hour:07d}.parquet"

    def _write_samples(self, frame: pl.DataFrame, epoch: int) -> list[tuple[str, bytes | None]]:
        gen = int(frame[GEN][0])
        hours = frame.with_columns(((pl.col("ts").dt.epoch("s") - epoch) // HOUR).alias("_hour"))
        writes: list[tuple[str, bytes | None]] = []
        for (hour,), part in hours.group_by("_hour", maintain_order=True):
            name = self._hour_name(int(hour))
            old = self._read_committed(name, gen - 1)
            part = part.drop("_hour")
            writes.append((name, _parquet(part if old is None else pl.concat([old, part]))))
        return writes

    def _prune_samples(
        self, writes: list[tuple[str, bytes | None]], epoch: int, clock: int
    ) -> list[tuple[str, bytes | None]]:
        """The sample writes of a commit less the hours past retention, plus the deletion of
        the stored hours past it."""
        oldest = (clock - self.sample_retention_s - epoch) // HOUR

        def old(name: str) -> bool:
            return int(name.rsplit("-", 1)[1].split(".")[0]) < oldest

        kept = [(name, body) for name, body in writes if not old(name)]
        return kept + [(name, None) for name in self.blobs.names(f"{SAMPLES}hour-") if old(name)]

    # -- reads -----------------------------------------------------------------------------
    def retained_from(self, epoch: int, clock: int) -> int:
        """Earliest sample time still buffered."""
        return max(epoch, epoch + ((clock - self.sample_retention_s - epoch) // HOUR) * HOUR)

    def read_samples(self, start: int, end: int, epoch: int, gen: int) -> pl.DataFrame:
        first, last = (max(start, epoch) - epoch) // HOUR, (end - 1 - epoch) // HOUR
        parts = []
        for hour in range(first, last + 1):
            frame = self._read_committed(self._hour_name(hour), gen)
            if frame is not None:
                parts.append(frame)
        if not parts:
            return pl.DataFrame(schema=SAMPLE_SCHEMA)
        seconds = pl.col("ts").dt.epoch("s")
        out = pl.concat(parts).filter((seconds >= start) & (seconds < end))
        return out.drop(GEN).select(list(SAMPLE_SCHEMA)).cast(SAMPLE_SCHEMA)  # type: ignore[arg-type]

    def read_events(self, start: int, end: int, gen: int) -> pl.DataFrame:
        frame = self._read_committed(EVENTS, gen)
        if frame is None:
            return pl.DataFrame(schema=TASK_EVENT_SCHEMA)
        seconds = pl.col("ts").dt.epoch("s")
        window = frame.filter((seconds >= start) & (seconds < end)).drop(GEN).select(list(TASK_EVENT_SCHEMA))
        return window.sort("ts", maintain_order=True)

    def read_ended(self, task_ids: Sequence[str], gen: int) -> list[dict[str, Any]]:
        frame = self._read_committed(ENDED, gen)
        if frame is None or not task_ids:
            return []
        return frame.filter(pl.col("task_id").is_in(list(task_ids))).drop(GEN).to_dicts()
