"""Telemetry in the warehouse: its three tables (clean samples, quarantined samples, the
ingest ledger), the connection an ingest writes through (holding the three tables' write
lock), the keys other sources already delivered clean, and the partition checks' reads
(the ledger, the accounting counts, freshness, a partition's clean rows), plus the fleet's
GPU UUIDs the rules check against. `telemetry` validates, screens and decides; these only
read and hold the connection.

It also holds the one DuckDB statement telemetry uses without a warehouse: text timestamps
parsed (ISO 8601 with any offset, or epoch seconds) in a throwaway in-memory database.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime

import duckdb
import polars as pl
import pyarrow as pa

from market_pipeline.warehouse.store import TableRewrite, Warehouse

CLEAN_TABLE = "telemetry_clean"
QUARANTINE_TABLE = "telemetry_quarantine"
LEDGER_TABLE = "telemetry_ingests"


def fleet_gpu_uuids(warehouse: Warehouse) -> frozenset[str]:
    """The fleet inventory's GPU UUIDs (empty: no inventory)."""
    frame = warehouse.query("SELECT gpu_uuid FROM fleet_gpus")
    return frozenset(frame.get_column("gpu_uuid").to_list())


@contextlib.contextmanager
def ingest_connection(warehouse: Warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """A write connection holding the telemetry tables' write lock (on a lake: the only ingest
    at a time), in UTC, its progress bar off (stderr belongs to the caller)."""
    with warehouse.write_lock(CLEAN_TABLE, QUARANTINE_TABLE, LEDGER_TABLE), warehouse.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET enable_progress_bar = false")  # stderr belongs to the caller
        yield con


def partition_rewrites(
    source: str, partitions: list[str], clean: pa.Table, quarantine: pa.Table, ledger: pl.DataFrame
) -> list[TableRewrite]:
    """An ingest's rewrites of `partitions` for `source`: the clean and quarantined rows that
    source's earlier ingests left there, and its ledger rows, replaced by these."""
    owned = (
        f"list_contains(?, partition_key) AND ingest_id IN (SELECT ingest_id FROM "
        f"{LEDGER_TABLE} WHERE source = ? AND list_contains(?, partition_key))"
    )
    params = (partitions, source, partitions)
    return [
        TableRewrite(CLEAN_TABLE, owned, params, clean),
        TableRewrite(QUARANTINE_TABLE, owned, params, quarantine),
        TableRewrite(
            LEDGER_TABLE, "source = ? AND list_contains(?, partition_key)", (source, partitions), ledger
        ),
    ]


def other_sources_ingests(con: duckdb.DuckDBPyConnection, source: str, partitions: Sequence[str]) -> int:
    """How many ingests of sources other than `source` left clean rows in `partitions`."""
    return con.execute(
        f"SELECT count(*) FROM {LEDGER_TABLE} WHERE source <> ? AND clean > 0 "
        "AND list_contains(?, partition_key)",
        [source, partitions],
    ).fetchone()[0]


def other_sources_keys(
    con: duckdb.DuckDBPyConnection, source: str, partitions: Sequence[str]
) -> pl.DataFrame:
    """The keys (node_id, gpu_uuid, ts) sources other than `source` delivered clean into
    `partitions`."""
    return con.execute(
        f"""SELECT c.node_id, c.gpu_uuid, c.ts FROM {CLEAN_TABLE} c
            JOIN {LEDGER_TABLE} i ON i.partition_key = c.partition_key
                                  AND i.ingest_id = c.ingest_id
            WHERE i.source <> ? AND list_contains(?, c.partition_key)""",
        [source, partitions],
    ).pl()


def ingest_ledger(warehouse: Warehouse, partition_key: str) -> pl.DataFrame:
    """The partition's ingests, by source: source, rows_in, clean, quarantined, by_reason (JSON)."""
    return warehouse.query(
        f"SELECT source, rows_in, clean, quarantined, by_reason FROM {LEDGER_TABLE} "
        "WHERE partition_key = ? ORDER BY source",
        [partition_key],
    )


def partition_counts(warehouse: Warehouse, partition_key: str) -> tuple[int, int, int]:
    """The partition's rows in (by the ledger), clean rows and quarantined rows (as stored)."""
    row = warehouse.query(
        f"""SELECT
              (SELECT coalesce(sum(rows_in), 0) FROM {LEDGER_TABLE} WHERE partition_key = $1),
              (SELECT count(*) FROM {CLEAN_TABLE} WHERE partition_key = $1),
              (SELECT count(*) FROM {QUARANTINE_TABLE} WHERE partition_key = $1)""",
        [partition_key],
    ).row(0)
    return int(row[0]), int(row[1]), int(row[2])


def latest_clean(warehouse: Warehouse) -> tuple[datetime | None, str | None]:
    """The latest clean sample's time and partition, in the latest partition with clean rows
    (None, None: no clean telemetry)."""
    row = warehouse.query(
        f"SELECT max(ts), max(partition_key) FROM {CLEAN_TABLE} "
        f"WHERE partition_key = (SELECT max(partition_key) FROM {LEDGER_TABLE} WHERE clean > 0)"
    ).row(0)
    return row[0], row[1]


def clean_rows(warehouse: Warehouse, partition_key: str, columns: Sequence[str]) -> pl.DataFrame:
    """The partition's clean rows, `columns` only."""
    names = ", ".join(columns)
    return warehouse.query(f"SELECT {names} FROM {CLEAN_TABLE} WHERE partition_key = ?", [partition_key])


def utilisation_between(warehouse: Warehouse, start: datetime, end: datetime) -> pl.DataFrame:
    """Clean samples in [start, end]: ts, node_id, gpu_uuid, sm_util_pct, task_id, tenant_id."""
    return warehouse.query(
        f"SELECT ts, node_id, gpu_uuid, sm_util_pct, task_id, tenant_id FROM {CLEAN_TABLE}"
        " WHERE ts >= ? AND ts <= ?",
        [start, end],
    )


def parse_timestamp_texts(texts: pl.DataFrame, zoned_pattern: str, max_epoch_seconds: float) -> pl.DataFrame:
    """Each text of `texts`' column `ts` (in UTC): iso (as an ISO 8601 time, or null), epoch (as
    epoch seconds in [0, max_epoch_seconds], or null), present (not blank) and naive (an ISO
    time whose text does not match `zoned_pattern`, the regular expression of a zone)."""
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("raw_ts", texts.to_arrow())
        return con.execute(
            f"""SELECT iso, epoch, present,
                    iso IS NOT NULL AND NOT regexp_matches(trimmed, '{zoned_pattern}') AS naive
                FROM (SELECT trim(ts) AS trimmed, TRY_CAST(trim(ts) AS TIMESTAMPTZ) AS iso,
                        CASE WHEN TRY_CAST(trim(ts) AS DOUBLE) BETWEEN 0 AND {max_epoch_seconds}
                             THEN to_timestamp(TRY_CAST(trim(ts) AS DOUBLE)) END AS epoch,
                        trim(ts) <> '' AS present
                      FROM raw_ts)"""
        ).pl()
    finally:
        con.close()
