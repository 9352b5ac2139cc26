"""The billing marts as export files: which marts an export holds (`DATASETS`, each with its
row id and period columns), a read-only connection that writes with one thread (the same bytes
on every rerun), a mart's columns, the billing periods a window touches, and one period's rows
copied to a CSV or Parquet file. `billing.export` names the files, checks them and swaps the
export into place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from market_pipeline.warehouse.store import Warehouse


@dataclass(frozen=True)
class Dataset:
    """One billing mart as files: its table, row id, the UTC-month column that partitions
    it and the naive-UTC period bounds that place a row in the window."""

    name: str
    table: str
    row_id: str
    period_start: str
    period_end: str


DATASETS: dict[str, tuple[Dataset, ...]] = {
    "focus": (
        Dataset(
            "focus", "focus_export", "x_FocusRowId", "x_ChargeHourUtc", "x_ChargeHourUtc + INTERVAL 1 HOUR"
        ),
    ),
    "invoices": (
        Dataset(
            "invoice_lines",
            "fct_invoice_lines",
            "invoice_line_id",
            "period_start_utc",
            "make_timestamp(epoch_us(period_end))",
        ),
    ),
    "economics": (
        Dataset(
            "pool_economics",
            "agg_pool_economics",
            "economics_row_id",
            "period_start_utc",
            "make_timestamp(epoch_us(period_end))",
        ),
        Dataset(
            "tenant_capacity_cost",
            "agg_tenant_capacity_cost",
            "allocation_row_id",
            "period_start_utc",
            "make_timestamp(epoch_us(period_end))",
        ),
    ),
}


@contextlib.contextmanager
def export_connection(warehouse: Warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """The warehouse read-only, writing files with one thread."""
    with warehouse.connect(read_only=True) as con:
        con.execute("SET threads = 1")  # one writer thread: the same bytes on every rerun
        yield con


def column_types(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    """The table's (column name, DuckDB type), in order."""
    return [(name, kind) for name, kind, *_ in con.execute(f"DESCRIBE {table}").fetchall()]


def select_list(con: duckdb.DuckDBPyConnection, table: str, fmt: str) -> str:
    """Every column; for CSV, times in the FOCUS date/time format (UTC, 'YYYY-MM-DDTHH:mm:ssZ')."""
    parts = []
    for name, kind in column_types(con, table):
        quoted = '"' + name.replace('"', '""') + '"'
        if fmt == "csv" and kind.upper().startswith("TIMESTAMP"):
            parts.append(f"strftime({quoted}, '%Y-%m-%dT%H:%M:%SZ') AS {quoted}")
        else:
            parts.append(quoted)
    return ", ".join(parts)


def _window(dataset: Dataset, lo: str, hi: str) -> str:
    return f"{dataset.period_start} >= TIMESTAMP '{lo}' AND {dataset.period_end} <= TIMESTAMP '{hi}'"


def window_periods(con: duckdb.DuckDBPyConnection, dataset: Dataset, lo: str, hi: str) -> list[str]:
    """The billing periods (UTC months, 'YYYY-MM') of the dataset's rows inside [lo, hi)
    (naive UTC texts); raises duckdb.CatalogException when the mart is not in the warehouse."""
    return [
        row[0]
        for row in con.execute(
            f"SELECT DISTINCT strftime(date_trunc('month', {dataset.period_start}), '%Y-%m') AS p"
            f" FROM {dataset.table} WHERE {_window(dataset, lo, hi)} ORDER BY p"
        ).fetchall()
    ]


def copy_period(
    con: duckdb.DuckDBPyConnection,
    dataset: Dataset,
    select: str,
    lo: str,
    hi: str,
    period: str,
    fmt: str,
    target: Path,
) -> int:
    """The dataset's rows inside [lo, hi) of billing period `period`, columns `select`
    (`select_list`), ordered by row id, written to `target` as `fmt`; returns how many."""
    options = "FORMAT csv, HEADER true" if fmt == "csv" else "FORMAT parquet, COMPRESSION zstd"
    query = (
        f"SELECT {select} FROM {dataset.table} WHERE {_window(dataset, lo, hi)} AND strftime(date_trunc('month', "
        f"{dataset.period_start}), '%Y-%m') = '{period}' ORDER BY {dataset.row_id}"
    )
    con.execute(f"COPY ({query}) TO '{target}' ({options})")
    return con.execute(f"SELECT count(*) FROM ({query})").fetchone()[0]
