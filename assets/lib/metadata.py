"""Operator metadata helpers: frames as Dagster tables with a schema, row counts."""

import math
from collections.abc import Sequence

import dagster as dg
import polars as pl

_KINDS = {
    pl.Float64: "float",
    pl.Float32: "float",
    pl.Int64: "int",
    pl.Int32: "int",
    pl.UInt32: "int",
    pl.Int16: "int",
    pl.Int8: "int",
    pl.UInt64: "int",
    pl.Boolean: "bool",
}
ROW_COUNT = "dagster/row_count"


def table_metadata(frame: pl.DataFrame | Sequence[dict], limit: int = 200) -> dg.TableMetadataValue:
    """A frame (or rows) as a Dagster table with its schema; floats rounded for reading, lists
    joined, missing values shown empty (never `nan` or `None`), at most `limit` rows."""
    if not isinstance(frame, pl.DataFrame):
        frame = pl.DataFrame(list(frame), infer_schema_length=None, strict=False) if frame else pl.DataFrame()
    frame = frame.head(limit).with_columns(
        [pl.col(pl.Float64, pl.Float32).round(4)]
        + [
            pl.col(name).list.eval(pl.element().cast(pl.Utf8)).list.join("; ")
            for name, dtype in frame.schema.items()
            if isinstance(dtype, pl.List)
        ]
        + [
            pl.col(name).cast(pl.Utf8)
            for name, dtype in frame.schema.items()
            if dtype not in _KINDS and not isinstance(dtype, pl.List) and dtype != pl.Utf8
        ]
    )
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name, _KINDS.get(dtype, "string")) for name, dtype in frame.schema.items()]
    )
    records = [dg.TableRecord({k: _cell(v) for k, v in row.items()}) for row in frame.to_dicts()]
    return dg.MetadataValue.table(records=records, schema=schema)


def _cell(value: object) -> object:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""  # a table cell an operator reads: empty, not "None" or "nan"
    return value
