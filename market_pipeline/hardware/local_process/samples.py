"""Telemetry of the `local-process` backend: the workers' own utilisation logs as samples.

Each toy worker appends `{"ts", "util_pct", ...}` lines (its measured busy share of wall
time) to its metrics file; a task's share of a GPU scales that to whole-GPU SM utilisation.
Power and temperature are not measurable for a process and stay null.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from market_pipeline.hardware.protocol import SAMPLE_SCHEMA, TASK_EVENT_SCHEMA


def _metrics_lines(path: Path) -> Iterable[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the worker may be mid-write on the last line
    return rows


def read_task_samples(
    records: Iterable[Mapping[str, Any]],
    start: datetime,
    end: datetime,
    node_id: str,
    memory_mib: Mapping[str, int],
    gpu_index: Mapping[str, int],
) -> pl.DataFrame:
    """Canonical samples with ts in [start, end) from every task's metrics file."""
    lo, hi = start.timestamp(), end.timestamp()
    rows: list[dict[str, Any]] = []
    for record in records:
        path = record.get("metrics_path")
        if not path:
            continue
        share = record["gpu_milli"] / 1000.0
        for line in _metrics_lines(Path(path)):
            ts = float(line.get("ts", 0.0))
            if not lo <= ts < hi:
                continue
            for gpu_uuid in record["gpu_uuids"]:
                rows.append(
                    {
                        "ts": datetime.fromtimestamp(ts, timezone.utc),
                        "node_id": node_id,
                        "gpu_uuid": gpu_uuid,
                        "gpu_index": gpu_index.get(gpu_uuid, 0),
                        "sm_util_pct": float(line.get("util_pct", 0.0)) * share,
                        "mem_used_mib": float(record["mem_mib"]),
                        "mem_total_mib": float(memory_mib.get(gpu_uuid, 0)),
                        "power_w": None,
                        "temp_c": None,
                        "mig_profile": None,
                        "task_id": record["task_id"],
                        "tenant_id": record["tenant_id"],
                        "xid_errors": 0,
                    }
                )
    return pl.DataFrame(rows, schema=SAMPLE_SCHEMA).sort("ts")


def task_events_frame(events: Iterable[Mapping[str, Any]], start: datetime, end: datetime) -> pl.DataFrame:
    rows = []
    for event in events:
        ts = datetime.fromisoformat(event["ts"])
        if start <= ts < end:
            rows.append({**event, "ts": ts})
    return pl.DataFrame(rows, schema=TASK_EVENT_SCHEMA).sort("ts")
