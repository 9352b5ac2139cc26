"""Coercion of telemetry as read (CSV text, Parquet, Arrow, adapter frames) to SAMPLE_SCHEMA.

Coercion never rejects a row: a value that does not parse becomes null in the typed column
and raises a flag in `unparsed__<column>`, so validation can name the exact problem. Only a
frame that lacks a required column is refused as a whole (`MissingColumnsError`).

A timestamp without a zone (a naive Parquet/Arrow datetime, a date, or ISO text with no
'Z' or offset) is read as a UTC wall clock and flagged in `naive__ts`. `localize_naive` then
either reinterprets it in the configured `telemetry.naive_timezone` or leaves the flag up,
and validation quarantines the row as `ts:naive`: a naive time is never silently UTC.
Epoch seconds are UTC by definition and are never naive.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.hardware.protocol import REQUIRED_SAMPLE_COLUMNS, SAMPLE_SCHEMA
from market_pipeline.warehouse.telemetry_store import parse_timestamp_texts

FLOAT_COLUMNS: tuple[str, ...] = ("sm_util_pct", "mem_used_mib", "mem_total_mib", "power_w", "temp_c")
INT_COLUMNS: tuple[str, ...] = ("gpu_index", "xid_errors")
KEY_TEXT_COLUMNS: tuple[str, ...] = ("node_id", "gpu_uuid")
SAMPLE_COLUMNS: tuple[str, ...] = tuple(SAMPLE_SCHEMA)
# Numeric timestamps are Unix epoch seconds; beyond this they are not plausible.
_MAX_EPOCH_SECONDS = 1e11
_INT32_MAX = 2**31 - 1
_TEXT_TYPES = (pl.Utf8, pl.Categorical, pl.Enum)


class TelemetryInputError(ValueError):
    """Telemetry input that cannot be ingested at all; the message names the problem.

    The message is one line: a reader's multi-line error (polars quotes the bad field over
    several lines) is folded, so the CLI prints one `error:` line.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class MissingColumnsError(TelemetryInputError):
    def __init__(self, missing: list[str], present: list[str], where: str = "input") -> None:
        self.missing = missing
        super().__init__(
            f"{where} lacks required telemetry column(s) {', '.join(missing)}; "
            f"it has: {', '.join(_printable(c) for c in present) or '(none)'}"
        )


def _printable(name: str) -> str:
    """A column name as it can be shown on one line (control characters escaped)."""
    return name if name.isprintable() else name.encode("unicode_escape").decode("ascii")


class UnreadableFileError(TelemetryInputError):
    """A telemetry file that does not exist or cannot be parsed."""


NAIVE_FLAG = "naive__ts"
# An ISO time whose time of day is followed by a zone: Z, UTC/GMT, +HH[:MM] or a zone name.
_ZONED_TEXT = r"\d:\d\d(:\d\d([.,]\d*)?)?\s*([zZ]|UTC|GMT|utc|gmt|[+-]\d\d(:?\d\d)?|[A-Za-z]+/[A-Za-z_/+-]+)$"


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
        [
            pl.col(c) if c in frame.columns else pl.lit(None, dtype=SAMPLE_SCHEMA[c]).alias(c)
            for c in SAMPLE_COLUMNS
        ]
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
    ts_typed, ts_unparsed, ts_naive = _timestamps(as_read.get_column("ts"))
    typed = typed.with_columns(
        ts_typed.alias("ts"), ts_unparsed.alias(unparsed_flag("ts")), ts_naive.alias(NAIVE_FLAG)
    )
    order = list(SAMPLE_COLUMNS) + [c for c in typed.columns if c.startswith("unparsed__")] + [NAIVE_FLAG]
    ignored = tuple(c for c in frame.columns if c not in SAMPLE_SCHEMA)
    return CoercedSamples(typed=typed.select(order), as_read=as_read, ignored_columns=ignored)


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


def _timestamps(raw: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """UTC microsecond timestamps, a flag for values present but unparseable, and a flag
    for values that carried no zone (read as a UTC wall clock; see `localize_naive`)."""
    dtype = raw.dtype
    target = SAMPLE_SCHEMA["ts"]
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone is None:
            return (raw.dt.replace_time_zone("UTC").cast(target), _all_false(raw.len()), raw.is_not_null())
        return raw.dt.convert_time_zone("UTC").cast(target), _all_false(raw.len()), _all_false(raw.len())
    if dtype == pl.Date:
        return (
            raw.cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
            _all_false(raw.len()),
            raw.is_not_null(),
        )
    if dtype == pl.Null:
        return (
            pl.Series(raw.name, [None] * raw.len(), dtype=target),
            _all_false(raw.len()),
            _all_false(raw.len()),
        )
    if dtype.is_numeric():
        seconds = raw.cast(pl.Float64)
        plausible = (seconds.is_finite() & seconds.is_between(0, _MAX_EPOCH_SECONDS)).fill_null(False)
        micros = pl.select(
            pl.when(plausible).then(seconds * 1_000_000).otherwise(None).cast(pl.Int64)
        ).to_series()
        return micros.cast(target), (seconds.is_not_null() & ~plausible), _all_false(raw.len())
    if isinstance(dtype, _TEXT_TYPES) or dtype == pl.Utf8:
        return _parse_text_timestamps(raw.cast(pl.Utf8))
    return pl.Series(raw.name, [None] * raw.len(), dtype=target), raw.is_not_null(), _all_false(raw.len())


def _all_false(length: int) -> pl.Series:
    return pl.Series(values=[], dtype=pl.Boolean).extend_constant(False, length)


def _parse_text_timestamps(text: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """ISO 8601 (any offset, 'Z', space or 'T'; no zone = naive) or epoch seconds, via DuckDB."""
    parsed = parse_timestamp_texts(pl.DataFrame({"ts": text}), _ZONED_TEXT, _MAX_EPOCH_SECONDS)
    iso = parsed.get_column("iso").cast(SAMPLE_SCHEMA["ts"])
    typed = iso.fill_null(parsed.get_column("epoch").cast(SAMPLE_SCHEMA["ts"]))
    unparsed = (parsed.get_column("present").fill_null(False) & typed.is_null()).alias("unparsed")
    return typed, unparsed, parsed.get_column("naive").fill_null(False).alias(NAIVE_FLAG)


def localize_naive(samples: CoercedSamples, zone: str | None) -> CoercedSamples:
    """Naive timestamps reinterpreted as wall clocks of `zone` (an IANA name), in UTC.

    Without a zone they stay flagged (validation quarantines them as `ts:naive`). A wall
    clock that does not exist in the zone (the spring-forward gap) becomes unparseable; an
    ambiguous one (the autumn repeat) takes the earlier instant.
    """
    typed = samples.typed
    if zone is None or NAIVE_FLAG not in typed.columns or not typed.get_column(NAIVE_FLAG).any():
        return samples
    naive = pl.col(NAIVE_FLAG)
    local = (
        pl.col("ts")
        .dt.replace_time_zone(None)
        .dt.replace_time_zone(zone, ambiguous="earliest", non_existent="null")
        .dt.convert_time_zone("UTC")
    )
    typed = typed.with_columns(
        pl.when(naive).then(local).otherwise(pl.col("ts")).alias("ts"),
        (pl.col(unparsed_flag("ts")) | (naive & local.is_null())).alias(unparsed_flag("ts")),
    ).with_columns(pl.lit(False).alias(NAIVE_FLAG))
    return CoercedSamples(typed=typed, as_read=samples.as_read, ignored_columns=samples.ignored_columns)


# -- files ---------------------------------------------------------------------------
PARQUET_SUFFIXES = {".parquet", ".pq"}
CSV_SUFFIXES = {".csv", ".tsv"}
EXPOSITION_SUFFIXES = {".txt", ".prom", ".metrics"}


def read_sample_file(path: str | Path) -> pl.DataFrame:
    """A CSV (read as text), Parquet or dcgm-exporter text file as a frame of sample columns."""
    try:
        path = checked_file(path, "telemetry file")
    except InputFileError as exc:
        raise UnreadableFileError(str(exc)) from None
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
            from market_pipeline.hardware.dcgm.exposition import read_exposition_file

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
