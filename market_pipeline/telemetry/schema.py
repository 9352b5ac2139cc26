"""Coercion of telemetry as read (CSV text, Parquet, Arrow, adapter frames) to SAMPLE_SCHEMA.

Coercion never rejects a row: a value that does not parse becomes null in the typed column
and raises a flag in `unparsed__<column>`, so validation can name the exact problem. Only a
frame that lacks a required column is refused as a whole (`MissingColumnsError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from market_pipeline.hardware.protocol import REQUIRED_SAMPLE_COLUMNS, SAMPLE_SCHEMA

FLOAT_COLUMNS: tuple[str, ...] = ("sm_util_pct", "mem_used_mib", "mem_total_mib", "power_w", "temp_c")
INT_COLUMNS: tuple[str, ...] = ("gpu_index", "xid_errors")
KEY_TEXT_COLUMNS: tuple[str, ...] = ("node_id", "gpu_uuid")
TEXT_COLUMNS: tuple[str, ...] = ("node_id", "gpu_uuid", "mig_profile", "task_id", "tenant_id")
SAMPLE_COLUMNS: tuple[str, ...] = tuple(SAMPLE_SCHEMA)
# Numeric timestamps are Unix epoch seconds; beyond this they are not plausible.
_MAX_EPOCH_SECONDS = 1e11
_INT32_MAX = 2**31 - 1
_TEXT_TYPES = (pl.Utf8, pl.Categorical, pl.Enum)


class TelemetryInputError(ValueError):
    """Telemetry input that cannot be ingested at all; the message names the problem."""


class MissingColumnsError(TelemetryInputError):
    def __init__(self, missing: list[str], present: list[str], where: str = "input") -> None:
        self.missing = missing
        super().__init__(
            f"{where} lacks required telemetry column(s) {', '.join(missing)}; "
            f"it has: {', '.join(present) or '(none)'}"
        )


class UnreadableFileError(TelemetryInputError):
    """A telemetry file that does not exist or cannot be parsed."""


def unparsed_flag(column: str) -> str:
    return f"unparsed__{column}"


@dataclass(frozen=True)
class CoercedSamples:
    """`typed`: SAMPLE_SCHEMA columns plus a boolean `unparsed__<col>` per column that could
    hold unparseable values. `as_read`: the sample columns as they came (quarantine payload)."""

    typed: pl.DataFrame
    as_read: pl.DataFrame
    ignored_columns: tuple[str, ...]

    @property
    def height(self) -> int:
        return self.typed.height


def require_columns(frame: pl.DataFrame, where: str = "input") -> None:
    missing = [c for c in REQUIRED_SAMPLE_COLUMNS if c not in frame.columns]
    if missing:
        raise MissingColumnsError(missing, list(frame.columns), where)


def coerce_samples(frame: pl.DataFrame, where: str = "input") -> CoercedSamples:
    """Type every sample column; flag values that are present but do not parse."""
    require_columns(frame, where)
    as_read = frame.select(
        [pl.col(c) if c in frame.columns else pl.lit(None, dtype=SAMPLE_SCHEMA[c]).alias(c)
         for c in SAMPLE_COLUMNS]
    )
    typed_exprs: list[pl.Expr] = []
    for column in SAMPLE_COLUMNS:
        dtype = as_read.schema[column]
        if column == "ts":
            continue  # handled below (text timestamps are parsed by DuckDB)
        if column in FLOAT_COLUMNS:
            typed_exprs.extend(_float_exprs(column, dtype))
        elif column in INT_COLUMNS:
            typed_exprs.extend(_int_exprs(column, dtype))
        else:
            typed_exprs.append(_text_expr(column, dtype))
    typed = as_read.select(typed_exprs)
    ts_typed, ts_unparsed = _timestamps(as_read.get_column("ts"))
    typed = typed.with_columns(ts_typed.alias("ts"), ts_unparsed.alias(unparsed_flag("ts")))
    order = list(SAMPLE_COLUMNS) + [c for c in typed.columns if c.startswith("unparsed__")]
    ignored = tuple(c for c in frame.columns if c not in SAMPLE_SCHEMA)
    return CoercedSamples(typed=typed.select(order), as_read=as_read, ignored_columns=ignored)


def _is_blank(column: str) -> pl.Expr:
    return pl.col(column).str.strip_chars().str.len_bytes() == 0


def _float_exprs(column: str, dtype: pl.DataType) -> list[pl.Expr]:
    flag = unparsed_flag(column)
    if dtype == pl.Float64:
        return [pl.col(column), pl.lit(False).alias(flag)]
    if dtype.is_numeric():
        return [pl.col(column).cast(pl.Float64), pl.lit(False).alias(flag)]
    if dtype == pl.Null:
        return [pl.col(column).cast(pl.Float64), pl.lit(False).alias(flag)]
    if isinstance(dtype, _TEXT_TYPES) or dtype == pl.Utf8:
        text = pl.col(column).cast(pl.Utf8)
        parsed = text.str.strip_chars().cast(pl.Float64, strict=False)
        present = text.is_not_null() & ~text.str.strip_chars().eq("")
        return [parsed.alias(column), (present & parsed.is_null()).alias(flag)]
    # Booleans, dates, nested values: present but not a number.
    return [pl.lit(None, dtype=pl.Float64).alias(column), pl.col(column).is_not_null().alias(flag)]


def _int_exprs(column: str, dtype: pl.DataType) -> list[pl.Expr]:
    flag = unparsed_flag(column)
    if dtype == pl.Int32:
        return [pl.col(column), pl.lit(False).alias(flag)]
    if dtype.is_integer():
        fits = pl.col(column).is_between(-_INT32_MAX, _INT32_MAX)
        value = pl.when(fits).then(pl.col(column)).otherwise(None).cast(pl.Int32)
        return [value.alias(column), (pl.col(column).is_not_null() & ~fits).alias(flag)]
    if dtype == pl.Null:
        return [pl.col(column).cast(pl.Int32), pl.lit(False).alias(flag)]
    if dtype.is_float():
        number = pl.col(column).cast(pl.Float64)
        present = number.is_not_null()
    elif isinstance(dtype, _TEXT_TYPES) or dtype == pl.Utf8:
        text = pl.col(column).cast(pl.Utf8).str.strip_chars()
        number = text.cast(pl.Float64, strict=False)
        present = text.is_not_null() & (text.str.len_bytes() > 0)
    else:
        return [pl.lit(None, dtype=pl.Int32).alias(column), pl.col(column).is_not_null().alias(flag)]
    integral = (
        number.is_finite() & (number == number.floor()) & number.is_between(-_INT32_MAX, _INT32_MAX)
    ).fill_null(False)
    value = pl.when(integral).then(number).otherwise(None).cast(pl.Int32)
    return [value.alias(column), (present & ~integral).alias(flag)]


def _text_expr(column: str, dtype: pl.DataType) -> pl.Expr:
    if dtype == pl.Utf8:
        return pl.col(column)
    return pl.col(column).cast(pl.Utf8)


def _timestamps(raw: pl.Series) -> tuple[pl.Series, pl.Series]:
    """UTC microsecond timestamps and a flag for values present but unparseable."""
    dtype = raw.dtype
    target = SAMPLE_SCHEMA["ts"]
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone is None:
            typed = raw.dt.replace_time_zone("UTC")
        else:
            typed = raw.dt.convert_time_zone("UTC")
        return typed.cast(target), _all_false(raw.len())
    if dtype == pl.Date:
        return raw.cast(pl.Datetime("us")).dt.replace_time_zone("UTC"), _all_false(raw.len())
    if dtype == pl.Null:
        return pl.Series(raw.name, [None] * raw.len(), dtype=target), _all_false(raw.len())
    if dtype.is_numeric():
        seconds = raw.cast(pl.Float64)
        plausible = (seconds.is_finite() & seconds.is_between(0, _MAX_EPOCH_SECONDS)).fill_null(False)
        micros = pl.select(
            pl.when(plausible).then(seconds * 1_000_000).otherwise(None).cast(pl.Int64)
        ).to_series()
        return micros.cast(target), (seconds.is_not_null() & ~plausible)
    if isinstance(dtype, _TEXT_TYPES) or dtype == pl.Utf8:
        return _parse_text_timestamps(raw.cast(pl.Utf8))
    return pl.Series(raw.name, [None] * raw.len(), dtype=target), raw.is_not_null()


def _all_false(length: int) -> pl.Series:
    return pl.Series(values=[], dtype=pl.Boolean).extend_constant(False, length)


def _parse_text_timestamps(text: pl.Series) -> tuple[pl.Series, pl.Series]:
    """ISO 8601 (any offset, 'Z', space or 'T'; naive = UTC) or epoch seconds, via DuckDB."""
    frame = pl.DataFrame({"ts": text})
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("raw_ts", frame.to_arrow())
        parsed = con.execute(
            f"""SELECT coalesce(
                    TRY_CAST(trim(ts) AS TIMESTAMPTZ),
                    CASE WHEN TRY_CAST(trim(ts) AS DOUBLE) BETWEEN 0 AND {_MAX_EPOCH_SECONDS}
                         THEN to_timestamp(TRY_CAST(trim(ts) AS DOUBLE)) END) AS ts,
                trim(ts) <> '' AS present
                FROM raw_ts"""
        ).pl()
    finally:
        con.close()
    typed = parsed.get_column("ts").cast(SAMPLE_SCHEMA["ts"])
    unparsed = (parsed.get_column("present").fill_null(False) & typed.is_null()).alias("unparsed")
    return typed, unparsed


# -- files ---------------------------------------------------------------------------
PARQUET_SUFFIXES = {".parquet", ".pq"}
CSV_SUFFIXES = {".csv", ".tsv"}
EXPOSITION_SUFFIXES = {".txt", ".prom", ".metrics"}


def read_sample_file(path: str | Path) -> pl.DataFrame:
    """A CSV (read as text), Parquet or dcgm-exporter text file as a frame of sample columns."""
    path = Path(path)
    if not path.is_file():
        raise UnreadableFileError(f"telemetry file {path} does not exist or is not a file")
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError as exc:
        raise UnreadableFileError(f"cannot read telemetry file {path}: {exc}") from exc
    kind = _file_kind(path, head)
    try:
        if kind == "parquet":
            return pl.read_parquet(path)
        if kind == "exposition":
            from market_pipeline.hardware.dcgm_exposition import read_exposition_file

            return read_exposition_file(path)
        separator = "\t" if path.suffix.lower() == ".tsv" else ","
        return pl.read_csv(path, infer_schema=False, separator=separator)
    except TelemetryInputError:
        raise
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise UnreadableFileError(f"cannot parse telemetry file {path} as {kind}: {exc}") from exc


def _file_kind(path: Path, head: bytes) -> str:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES or head.startswith(b"PAR1"):
        return "parquet"
    if suffix in EXPOSITION_SUFFIXES or b"# TYPE DCGM_" in head or head.startswith(b"DCGM_FI_"):
        return "exposition"
    if suffix in CSV_SUFFIXES or not suffix:
        if b"\x00" in head:
            raise UnreadableFileError(f"telemetry file {path} is binary, not CSV text")
        return "csv"
    raise UnreadableFileError(
        f"telemetry file {path}: unknown format {suffix!r} (expected .csv, .parquet or a "
        "dcgm-exporter .txt/.prom exposition)"
    )
