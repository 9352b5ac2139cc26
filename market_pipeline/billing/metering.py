"""Metering: task lifecycle events + the task catalog -> per-second usage intervals.

One interval per (task, GPU, hourly partition): it opens at the task's start (or the hour's
start) and closes at the task's end, drain or failure (or the hour's end, `end_reason =
'running'`). Timestamps are whole seconds: the start second is floored and the end second
is ceiled, so a started second is a metered second. A fractional share or MIG slice is
metered as its compute fraction (`gpu_milli / 1000`); memory is metered per GPU.

Only events with `ts < window_end` shape a window's intervals, so re-metering a closed hour
is deterministic however late it runs. The drain signal (if any) is carried on every later
interval of the task: rating stops billing at `drain_signal_at + grace`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

import polars as pl

from market_pipeline.billing.errors import MeteringError
from market_pipeline.hardware.protocol import TASK_EVENT_SCHEMA, TaskInfo

UTC = dt.timezone.utc
PARTITION_KEY_FORMAT = "%Y-%m-%d-%H:%M"  # Dagster's hourly partition key format
TERMINAL_EVENTS = ("end", "drained", "failed")
KNOWN_EVENTS = ("start", "drain_signal", *TERMINAL_EVENTS)
RUNNING = "running"

USAGE_INTERVAL_SCHEMA: dict[str, pl.DataType] = {
    "interval_id": pl.Utf8,
    "task_id": pl.Utf8,
    "tenant_id": pl.Utf8,
    "pool_id": pl.Utf8,
    "gpu_model": pl.Utf8,
    "zone": pl.Utf8,
    "resource_class": pl.Utf8,
    "node_id": pl.Utf8,
    "gpu_uuid": pl.Utf8,
    "gpu_fraction": pl.Decimal(6, 4),
    "mig_profile": pl.Utf8,
    "mem_mib": pl.Int32,
    "started_at": pl.Datetime("us", "UTC"),
    "ended_at": pl.Datetime("us", "UTC"),
    "end_reason": pl.Utf8,
    "drain_signal_at": pl.Datetime("us", "UTC"),
    "platform_fault": pl.Boolean,
    "partition_key": pl.Utf8,
}


@dataclass(frozen=True)
class HourWindow:
    """One hourly partition, [start, end) in UTC."""

    start: dt.datetime
    end: dt.datetime

    @property
    def partition_key(self) -> str:
        return self.start.strftime(PARTITION_KEY_FORMAT)

    @classmethod
    def from_partition_key(cls, key: str) -> "HourWindow":
        try:
            start = dt.datetime.strptime(key, PARTITION_KEY_FORMAT).replace(tzinfo=UTC)
        except ValueError as exc:
            raise MeteringError(f"partition key {key!r} is not an hourly key like 2026-01-01-13:00") from exc
        if start.minute or start.second:
            raise MeteringError(f"partition key {key!r} does not start on the hour")
        return cls(start, start + dt.timedelta(hours=1))

    @classmethod
    def containing(cls, moment: dt.datetime) -> "HourWindow":
        start = _as_utc(moment, "moment").replace(minute=0, second=0, microsecond=0)
        return cls(start, start + dt.timedelta(hours=1))


@dataclass(frozen=True)
class TaskLifecycle:
    """What the events (before a window's end) say about one task."""

    task_id: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    end_reason: str | None
    drain_signal_at: dt.datetime | None
    platform_fault: bool


def _as_utc(value: dt.datetime, name: str) -> dt.datetime:
    if value.tzinfo is None:
        raise MeteringError(f"{name} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _floor_second(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=0)


def _ceil_second(value: dt.datetime) -> dt.datetime:
    floored = value.replace(microsecond=0)
    return floored if floored == value else floored + dt.timedelta(seconds=1)


def validate_events(events: pl.DataFrame) -> pl.DataFrame:
    """Check columns and event names; return the frame cast to TASK_EVENT_SCHEMA."""
    missing = [c for c in TASK_EVENT_SCHEMA if c not in events.columns]
    if missing:
        raise MeteringError(f"task events lack column(s) {missing}; need {list(TASK_EVENT_SCHEMA)}")
    frame = events.select(list(TASK_EVENT_SCHEMA)).cast(TASK_EVENT_SCHEMA)  # type: ignore[arg-type]
    unknown = frame.filter(~pl.col("event").is_in(KNOWN_EVENTS))
    if unknown.height:
        bad = unknown.select("task_id", "event").head(5).rows()
        raise MeteringError(f"task events with unknown event name(s) {bad}; allowed {KNOWN_EVENTS}")
    nulls = frame.filter(pl.col("ts").is_null() | pl.col("task_id").is_null())
    if nulls.height:
        raise MeteringError(f"{nulls.height} task event(s) without ts or task_id")
    return frame.with_columns(pl.col("platform_fault").fill_null(False))


def task_lifecycles(
    events: pl.DataFrame,
    catalog: Mapping[str, TaskInfo],
    before: dt.datetime,
    carried_drain_signals: Mapping[str, dt.datetime] | None = None,
    platform_faults: Iterable[str] = (),
) -> dict[str, TaskLifecycle]:
    """Each catalogued task's lifecycle as known from events with ts < `before`.

    `platform_faults` names tasks whose end the drain records attribute to the platform
    (the adapter's own `platform_fault` flag counts too).
    """
    before = _as_utc(before, "before")
    frame = validate_events(events).filter(pl.col("ts") < before).sort("ts", "event")
    unknown = set(frame.get_column("task_id").unique().to_list()) - set(catalog)
    if unknown:
        raise MeteringError(
            f"task events name task(s) missing from the adapter's task catalog: {sorted(unknown)[:10]}"
        )
    by_task: dict[str, list[dict]] = {}
    for row in frame.iter_rows(named=True):
        by_task.setdefault(row["task_id"], []).append(row)
    carried = carried_drain_signals or {}
    faulted = set(platform_faults)
    return {
        task_id: _lifecycle(task, by_task.get(task_id, []), carried.get(task_id), task_id in faulted)
        for task_id, task in catalog.items()
    }


def _lifecycle(
    task: TaskInfo, rows: Sequence[dict], carried_signal: dt.datetime | None, fault_recorded: bool = False
) -> TaskLifecycle:
    starts = [r["ts"] for r in rows if r["event"] == "start"]
    started_at = starts[0] if starts else _as_utc(task.started_at, f"task {task.task_id} started_at")
    terminal = next((r for r in rows if r["event"] in TERMINAL_EVENTS and r["ts"] >= started_at), None)
    ended_at = terminal["ts"] if terminal else None
    signals = [
        r["ts"]
        for r in rows
        if r["event"] == "drain_signal"
        and r["ts"] >= started_at
        and (ended_at is None or r["ts"] <= ended_at)
    ]
    if carried_signal is not None:
        signals.append(_as_utc(carried_signal, f"carried drain signal of {task.task_id}"))
    return TaskLifecycle(
        task_id=task.task_id,
        started_at=started_at,
        ended_at=ended_at,
        end_reason=terminal["event"] if terminal else None,
        drain_signal_at=min(signals) if signals else None,
        platform_fault=(bool(terminal["platform_fault"]) or fault_recorded) if terminal else False,
    )


def gpu_fraction(task: TaskInfo) -> Decimal:
    """The compute fraction of one GPU the task holds (MIG slice or fractional share)."""
    if not 0 < task.gpu_milli <= 1000:
        raise MeteringError(f"task {task.task_id}: gpu_milli {task.gpu_milli} is not in 1..1000")
    return (Decimal(task.gpu_milli) / Decimal(1000)).quantize(Decimal("0.0001"))


def _split_memory(total_mib: int, parts: int) -> list[int]:
    """Even integer split whose parts add up to the total (remainder to the first GPUs)."""
    base, extra = divmod(max(total_mib, 0), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def task_intervals(
    task: TaskInfo, life: TaskLifecycle, window: HourWindow, pools: Mapping[str, tuple[str, str]]
) -> list[dict]:
    """The task's usage interval rows in the window, one per GPU (empty if it did not run)."""
    if not task.gpu_uuids:
        raise MeteringError(f"task {task.task_id} holds no GPU (empty gpu_uuids)")
    if task.pool_id not in pools:
        raise MeteringError(f"task {task.task_id}: unknown pool {task.pool_id!r}")
    start = max(_floor_second(life.started_at), window.start)
    end_at = life.ended_at if life.ended_at is not None else window.end
    end = min(_ceil_second(end_at), window.end)
    if end <= start:
        return []
    closed_here = life.ended_at is not None and life.ended_at < window.end
    end_reason = life.end_reason if closed_here else RUNNING
    signal = life.drain_signal_at if life.drain_signal_at is not None and life.drain_signal_at < end else None
    gpu_model, zone = pools[task.pool_id]
    fraction = gpu_fraction(task)
    memory = _split_memory(task.mem_mib, len(task.gpu_uuids))
    return [
        {
            "interval_id": f"{task.task_id}:{gpu_uuid}:{window.partition_key}",
            "task_id": task.task_id,
            "tenant_id": task.tenant_id,
            "pool_id": task.pool_id,
            "gpu_model": gpu_model,
            "zone": zone,
            "resource_class": getattr(task.resource_class, "value", str(task.resource_class)),
            "node_id": task.node_id,
            "gpu_uuid": gpu_uuid,
            "gpu_fraction": fraction,
            "mig_profile": task.mig_profile,
            "mem_mib": mem,
            "started_at": start,
            "ended_at": end,
            "end_reason": end_reason,
            "drain_signal_at": _floor_second(signal) if signal is not None else None,
            "platform_fault": life.platform_fault and closed_here,
            "partition_key": window.partition_key,
        }
        for gpu_uuid, mem in zip(task.gpu_uuids, memory)
    ]


def meter_window(
    events: pl.DataFrame,
    catalog: Iterable[TaskInfo],
    window: HourWindow,
    pools: Mapping[str, tuple[str, str]],
    carried_drain_signals: Mapping[str, dt.datetime] | None = None,
    platform_faults: Iterable[str] = (),
) -> pl.DataFrame:
    """Usage intervals of every catalogued task in the window, USAGE_INTERVAL_SCHEMA.

    `pools` maps pool_id -> (gpu_model, zone). `carried_drain_signals` holds drain signals
    known from elsewhere (earlier partitions, drain records) for tasks whose signal event
    `events` do not reach. `platform_faults`: tasks whose end was platform-caused.
    """
    by_id = {task.task_id: task for task in catalog}
    lives = task_lifecycles(events, by_id, window.end, carried_drain_signals, platform_faults)
    rows: list[dict] = []
    for task_id in sorted(by_id):
        rows.extend(task_intervals(by_id[task_id], lives[task_id], window, pools))
    return (
        pl.DataFrame(rows, schema=USAGE_INTERVAL_SCHEMA, orient="row")
        if rows
        else pl.DataFrame(schema=USAGE_INTERVAL_SCHEMA)
    )


def metered_seconds(intervals: pl.DataFrame) -> int:
    """Total metered interval-seconds (per GPU row, not weighted by fraction)."""
    if intervals.is_empty():
        return 0
    spans = (intervals["ended_at"] - intervals["started_at"]).dt.total_seconds()
    return int(spans.sum())


def gpu_seconds(intervals: pl.DataFrame) -> Decimal:
    """Metered GPU-seconds weighted by each interval's GPU fraction (exact)."""
    total = Decimal(0)
    for start, end, fraction in intervals.select("started_at", "ended_at", "gpu_fraction").iter_rows():
        total += Decimal(int((end - start).total_seconds())) * fraction
    return total
