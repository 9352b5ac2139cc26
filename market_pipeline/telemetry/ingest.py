"""Validated, idempotent ingestion of telemetry samples into the warehouse.

One ingest reads a frame from one *source* (the adapter, a file), validates it, and rewrites
the partitions it touches for that source in one transaction: clean rows, quarantined rows
(with their reasons) and one ledger row per partition. Re-ingesting the same source into a
partition replaces what it wrote there before; other sources in the same partition stay,
and a key another source already delivered is quarantined as `key:already_ingested`.

Partitioning: with a window (the Dagster asset, one hourly partition) every row belongs to
that partition and rows outside it are quarantined as `ts:outside_partition`; without one
(a file) each row belongs to the hour of its own timestamp, and rows without a usable
timestamp to the file's earliest hour (or the hour of `fallback_time` if none has one).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import polars as pl
import pyarrow as pa

from market_pipeline.telemetry.partitions import partition_key_of_hour
from market_pipeline.telemetry.rules import (
    ALREADY_INGESTED,
    KEY_COLUMNS,
    REASON_BIT,
    UNPLACEABLE_TS,
    Screening,
    ValidationPolicy,
    count_reasons,
    reasons_expr,
    screen,
)
from market_pipeline.telemetry.schema import SAMPLE_COLUMNS, CoercedSamples, coerce_samples, localize_naive
from market_pipeline.warehouse import TableRewrite, Warehouse, telemetry_store

_MICROS_PER_HOUR = 3_600_000_000


class TelemetryAccountingError(RuntimeError):
    """raw != clean + quarantined inside one ingest: a defect, never written."""


@dataclass(frozen=True)
class IngestReport:
    ingest_id: int
    source: str
    rows_in: int
    clean: int
    quarantined: int
    by_reason: dict[str, int]
    partitions: tuple[str, ...]
    ignored_columns: tuple[str, ...] = ()
    seconds: float = 0.0

    def summary(self) -> dict[str, object]:
        """The CLI's JSON contract."""
        return {
            "rows_in": self.rows_in,
            "clean": self.clean,
            "quarantined": self.quarantined,
            "by_reason": dict(self.by_reason),
        }

    @property
    def quarantine_rate(self) -> float:
        return self.quarantined / self.rows_in if self.rows_in else 0.0


def known_gpu_uuids(warehouse: Warehouse) -> frozenset[str]:
    """The fleet inventory's GPU UUIDs (empty: no inventory, the UUID rule is off)."""
    return telemetry_store.fleet_gpu_uuids(warehouse)


def ingest_samples(
    warehouse: Warehouse,
    frame: pl.DataFrame,
    *,
    source: str,
    policy: ValidationPolicy,
    fallback_time: datetime | None = None,
    where: str = "input",
) -> IngestReport:
    """Validate `frame` and rewrite the partitions it touches for `source`."""
    started = time.perf_counter()
    samples = localize_naive(coerce_samples(frame, where), policy.naive_timezone)
    screening = screen(samples, policy)
    hours = _row_hours(samples, screening, policy, fallback_time)
    # on a lake: the only ingest at a time (its id is one past the largest, and its rewrites keyed)
    with telemetry_store.ingest_connection(warehouse) as con:
        ingest_id = warehouse.next_id(con, "telemetry_ingest_seq")
        screening = _quarantine_keys_of_other_sources(con, samples, screening, hours, source)
        good = screening.good_mask()
        clean = _clean_frame(samples, good, hours, ingest_id)
        quarantine = _quarantine_frame(samples, screening, hours, ingest_id)
        ledger = _ledger_frame(clean, quarantine, source, ingest_id, policy)
        rows_in = samples.height
        if clean.height + quarantine.height != rows_in:
            raise TelemetryAccountingError(
                f"ingest of {source}: {rows_in} rows in, {clean.height} clean + "
                f"{quarantine.height} quarantined"
            )
        partitions = ledger.get_column("partition_key").to_list()
        warehouse.rewrite_tables(_rewrites(source, partitions, clean, quarantine, ledger), con=con)
    return IngestReport(
        ingest_id=ingest_id,
        source=source,
        rows_in=rows_in,
        clean=clean.height,
        quarantined=quarantine.height,
        by_reason=count_reasons(screening.bad_bits),
        partitions=tuple(partitions),
        ignored_columns=samples.ignored_columns,
        seconds=time.perf_counter() - started,
    )


def _row_hours(
    samples: CoercedSamples, screening: Screening, policy: ValidationPolicy, fallback_time: datetime | None
) -> pl.Series | int:
    """Each row's partition as an epoch hour (a single int in window mode)."""
    if policy.window is not None:
        return int(policy.window.start.timestamp()) // 3600
    ts_hour = samples.typed.select(
        (pl.col("ts").dt.epoch("us") // _MICROS_PER_HOUR).alias("hour")
    ).to_series()
    unusable = np.zeros(samples.height, dtype=bool)
    unplaceable = np.uint64(sum(REASON_BIT[r] for r in UNPLACEABLE_TS))
    unusable[screening.bad_rows[(screening.bad_bits & unplaceable) != 0]] = True
    usable = ts_hour.filter(~pl.Series(unusable) & ts_hour.is_not_null())
    if usable.len():
        home = int(usable.min())
    else:
        when = fallback_time or policy.now
        home = int(when.astimezone(timezone.utc).timestamp()) // 3600
    if not unusable.any() and ts_hour.null_count() == 0:
        return ts_hour
    return (
        pl.select(pl.when(pl.Series(unusable) | ts_hour.is_null()).then(home).otherwise(ts_hour))
        .to_series()
        .cast(pl.Int64)
    )


def _keys_expr(hours: pl.Series | int, rows: np.ndarray | None) -> tuple[pl.Expr, list[str]]:
    """The partition_key column for the selected rows and the distinct keys it holds."""
    if isinstance(hours, int):
        key = partition_key_of_hour(hours)
        return pl.lit(key, dtype=pl.Utf8), [key]
    selected = hours if rows is None else hours.filter(pl.Series(rows))
    distinct = sorted(int(h) for h in selected.unique().to_list())
    mapping = {h: partition_key_of_hour(h) for h in distinct}
    keys = sorted(mapping.values())
    expr = (
        pl.lit(selected).replace_strict(mapping, return_dtype=pl.Enum(keys))
        if keys
        else (pl.lit(None, dtype=pl.Utf8))
    )
    return expr, keys


def _clean_frame(
    samples: CoercedSamples, good: np.ndarray, hours: pl.Series | int, ingest_id: int
) -> pl.DataFrame:
    typed = samples.typed.select(SAMPLE_COLUMNS)
    all_good = bool(good.all())
    clean = typed if all_good else typed.filter(pl.Series(good))
    key_expr, _ = _keys_expr(hours, None if all_good else good)
    return clean.with_columns(
        key_expr.alias("partition_key"), pl.lit(ingest_id, dtype=pl.Int64).alias("ingest_id")
    )


def _quarantine_frame(
    samples: CoercedSamples, screening: Screening, hours: pl.Series | int, ingest_id: int
) -> pl.DataFrame:
    rows = pl.Series(screening.bad_rows, dtype=pl.UInt32)
    payload = samples.as_read[rows].select([_as_text(c, samples.as_read.schema[c]) for c in SAMPLE_COLUMNS])
    if isinstance(hours, int):
        keys = pl.lit(partition_key_of_hour(hours), dtype=pl.Utf8)
    else:
        bad = np.zeros(samples.height, dtype=bool)
        bad[screening.bad_rows] = True
        keys, _ = _keys_expr(hours, bad)
    return payload.with_columns(
        pl.lit((rows.cast(pl.Int64) + 1)).alias("source_row"),
        pl.lit(pl.Series(screening.bad_bits, dtype=pl.UInt64)).alias("bits"),
        keys.alias("partition_key"),
        pl.lit(ingest_id, dtype=pl.Int64).alias("ingest_id"),
    ).with_columns(reasons_expr("bits").alias("reasons"))


def _as_text(column: str, dtype: pl.DataType) -> pl.Expr:
    if dtype == pl.Utf8:
        return pl.col(column)
    if dtype.is_nested() or dtype == pl.Object:
        return pl.col(column).map_elements(_value_text, return_dtype=pl.Utf8).alias(column)
    return pl.col(column).cast(pl.Utf8).alias(column)


def _value_text(value: object) -> str:
    """A nested value as Python writes it (polars hands a list cell over as a Series, whose
    repr is a multi-line table with rounded numbers, not the value)."""
    return repr(value.to_list() if isinstance(value, pl.Series) else value)


def _ledger_frame(
    clean: pl.DataFrame, quarantine: pl.DataFrame, source: str, ingest_id: int, policy: ValidationPolicy
) -> pl.DataFrame:
    counts: dict[str, list[int]] = {}
    for key, count in clean.group_by("partition_key").len().iter_rows():
        counts.setdefault(str(key), [0, 0])[0] += count
    by_reason: dict[str, dict[str, int]] = {}
    for key, count in quarantine.group_by("partition_key").len().iter_rows():
        counts.setdefault(str(key), [0, 0])[1] += count
    exploded = quarantine.select("partition_key", "reasons").explode("reasons")
    for key, reason, count in exploded.group_by("partition_key", "reasons").len().iter_rows():
        by_reason.setdefault(str(key), {})[reason] = count
    if not counts and policy.window is not None:
        counts[policy.window.key] = [0, 0]  # an empty window is still a materialised partition
    keys = sorted(counts)
    return pl.DataFrame(
        {
            "partition_key": keys,
            "source": [source] * len(keys),
            "ingest_id": [ingest_id] * len(keys),
            "rows_in": [sum(counts[k]) for k in keys],
            "clean": [counts[k][0] for k in keys],
            "quarantined": [counts[k][1] for k in keys],
            "by_reason": [json.dumps(dict(sorted(by_reason.get(k, {}).items()))) for k in keys],
            "ingested_at": [datetime.now(timezone.utc)] * len(keys),
        },
        schema_overrides={
            "ingest_id": pl.Int64,
            "rows_in": pl.Int64,
            "clean": pl.Int64,
            "quarantined": pl.Int64,
            "ingested_at": pl.Datetime("us", "UTC"),
        },
    )


def _rewrites(
    source: str, partitions: list[str], clean: pl.DataFrame, quarantine: pl.DataFrame, ledger: pl.DataFrame
) -> list[TableRewrite]:
    quarantine_columns = ["source_row", *SAMPLE_COLUMNS, "reasons", "partition_key", "ingest_id"]
    return telemetry_store.partition_rewrites(
        source, partitions, _arrow(clean), _arrow(quarantine.select(quarantine_columns)), ledger
    )


def _arrow(frame: pl.DataFrame) -> pa.Table:
    # Arrow string views are zero-copy from polars (the default large strings are a copy
    # of every key, which cost more than all of validation at fleet scale).
    return frame.to_arrow(compat_level=pl.CompatLevel.newest())


def _quarantine_keys_of_other_sources(
    con, samples: CoercedSamples, screening: Screening, hours: pl.Series | int, source: str
) -> Screening:
    """Keys that another source already delivered clean into these partitions."""
    good = screening.good_mask()
    _, partitions = _keys_expr(hours, good)
    if not partitions:
        return screening
    others = telemetry_store.other_sources_ingests(con, source, partitions)
    if not others:
        return screening
    existing = telemetry_store.other_sources_keys(con, source, partitions).with_columns(
        pl.col("ts").cast(samples.typed.schema["ts"])
    )
    candidates = samples.typed.select(KEY_COLUMNS).with_row_index("position").filter(pl.Series(good))
    clashes = candidates.join(existing, on=list(KEY_COLUMNS), how="semi")
    positions = clashes.get_column("position").to_numpy().astype(np.uint32)
    return screening.with_reason(positions, ALREADY_INGESTED)
