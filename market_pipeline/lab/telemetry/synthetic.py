"""Generated fleet telemetry for benchmarks and tests: a fleet sampled once a minute.

Deterministic under a seed. `bad_share` of the rows are spoiled in rotating ways (NaN and
negative values, empty keys, future timestamps, exact copies) so that validation has work.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl

from market_pipeline.hardware.protocol import SAMPLE_SCHEMA

FLEET_START = datetime(2024, 1, 1, tzinfo=timezone.utc)


def fleet_gpu_uuids(nodes: int, gpus_per_node: int) -> list[str]:
    return [f"GPU-{n:06d}-{g:02d}-0000-0000-000000000000" for n in range(nodes) for g in range(gpus_per_node)]


def fleet_samples(
    rows: int,
    *,
    nodes: int = 1000,
    gpus_per_node: int = 8,
    start: datetime = FLEET_START,
    step_seconds: int = 60,
    seed: int = 7,
    bad_share: float = 0.0,
) -> pl.DataFrame:
    """`rows` samples in SAMPLE_SCHEMA: every GPU of the fleet once per step, in time order."""
    rng = np.random.default_rng(seed)
    fleet = nodes * gpus_per_node
    position = np.arange(rows, dtype=np.int64)
    gpu = position % fleet
    step = position // fleet
    start_us = int(start.timestamp() * 1_000_000)
    node_names = pl.Series([f"node-{n:05d}" for n in range(nodes)], dtype=pl.Utf8)
    uuids = pl.Series(fleet_gpu_uuids(nodes, gpus_per_node), dtype=pl.Utf8)
    busy = rng.random(rows) < 0.7
    frame = pl.DataFrame(
        {
            "ts": pl.Series(start_us + step * step_seconds * 1_000_000).cast(SAMPLE_SCHEMA["ts"]),
            "node_id": node_names.gather(gpu // gpus_per_node),
            "gpu_uuid": uuids.gather(gpu),
            "gpu_index": pl.Series((gpu % gpus_per_node).astype(np.int32)),
            "sm_util_pct": np.where(busy, rng.uniform(20, 100, rows), rng.uniform(0, 5, rows)),
            "mem_used_mib": np.where(busy, rng.uniform(4_000, 80_000, rows), 0.0),
            "mem_total_mib": np.full(rows, 81_920.0),
            "power_w": np.where(busy, rng.uniform(250, 700, rows), rng.uniform(60, 90, rows)),
            "temp_c": np.where(busy, rng.uniform(55, 85, rows), rng.uniform(30, 40, rows)),
            "mig_profile": pl.Series([None], dtype=pl.Utf8).extend_constant(None, rows - 1)
            if rows
            else pl.Series([], dtype=pl.Utf8),
            "task_id": pl.Series(["task-a", None], dtype=pl.Utf8).gather(np.where(busy, 0, 1)),
            "tenant_id": pl.Series(["acme-research", None], dtype=pl.Utf8).gather(np.where(busy, 0, 1)),
            "xid_errors": pl.Series(np.zeros(rows, dtype=np.int32)),
        }
    ).cast(SAMPLE_SCHEMA)
    if bad_share > 0 and rows:
        frame = spoil(frame, bad_share, rng)
    return frame


def spoil(frame: pl.DataFrame, share: float, rng: np.random.Generator) -> pl.DataFrame:
    """Spoil `share` of the rows in place (same height), cycling through six kinds of damage."""
    count = int(frame.height * share)
    if count == 0:
        return frame
    picked = np.sort(rng.choice(frame.height, size=count, replace=False))
    kind = np.arange(count) % 6
    far_future = frame.get_column("ts").max() + timedelta(days=365)
    column = {name: frame.get_column(name).to_numpy().copy() for name in ("sm_util_pct", "power_w", "temp_c")}
    column["sm_util_pct"][picked[kind == 0]] = np.nan
    column["power_w"][picked[kind == 1]] = -5.0
    column["temp_c"][picked[kind == 2]] = 400.0
    spoiled = frame.with_columns(
        pl.Series("sm_util_pct", column["sm_util_pct"]),
        pl.Series("power_w", column["power_w"]),
        pl.Series("temp_c", column["temp_c"]),
    )
    empty_key = np.zeros(frame.height, dtype=bool)
    empty_key[picked[kind == 3]] = True
    future = np.zeros(frame.height, dtype=bool)
    future[picked[kind == 4]] = True
    spoiled = spoiled.with_columns(
        pl.when(pl.Series(empty_key)).then(pl.lit("")).otherwise(pl.col("node_id")).alias("node_id"),
        pl.when(pl.Series(future)).then(pl.lit(far_future)).otherwise(pl.col("ts")).alias("ts"),
    )
    # Exact copies: the row takes its predecessor's values (a re-sent sample).
    order = np.arange(frame.height)
    copied = picked[(kind == 5) & (picked > 0)]
    order[copied] = copied - 1
    return spoiled[pl.Series(order)]
