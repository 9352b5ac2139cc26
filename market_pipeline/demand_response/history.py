"""(price, demand) histories per pool x class: from a CSV (`demand fit --history`) or from the
warehouse (the refit asset), and the fit of every pool x class of one."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.demand_response.estimator import (
    STRUCTURE_ALPHA,
    DemandResponseInputError,
    ResponseFit,
    fit_elasticity,
)
from market_pipeline.market.resources import RESOURCE_CLASSES
from market_pipeline.warehouse import Warehouse, readers

COLUMNS = ("ts", "pool_id", "resource_class", "price", "demand")
HISTORY_SCHEMA = {
    "ts": pl.Datetime("us", "UTC"),
    "pool_id": pl.Utf8,
    "resource_class": pl.Utf8,
    "price": pl.Float64,
    "demand": pl.Float64,
}


def read_history_csv(path: str | Path) -> pl.DataFrame:
    """The CSV's rows, typed; one DemandResponseInputError line for anything wrong with it."""
    try:
        path = checked_file(path, "history file")
    except InputFileError as exc:
        raise DemandResponseInputError(str(exc)) from None
    try:
        raw = pl.read_csv(path, infer_schema=False)
    except (pl.exceptions.PolarsError, UnicodeDecodeError, OSError) as exc:
        raise DemandResponseInputError(
            f"{path}: not a readable CSV ({' '.join(str(exc).split())[:120]})"
        ) from None
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise DemandResponseInputError(
            f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(COLUMNS)})"
        )
    if raw.is_empty():
        raise DemandResponseInputError(f"{path}: no rows")
    ts = raw["ts"].str.to_datetime(time_zone="UTC", strict=False)
    bad = raw.filter(ts.is_null())
    if bad.height:
        raise DemandResponseInputError(f"{path}: ts {bad['ts'][0]!r} is not an ISO UTC time")
    frame = raw.with_columns(
        ts=ts,
        price=pl.col("price").cast(pl.Float64, strict=False),
        demand=pl.col("demand").cast(pl.Float64, strict=False),
    )
    for col in ("price", "demand"):
        bad = frame.filter(pl.col(col).is_null() | ~pl.col(col).is_finite())
        if bad.height:
            raise DemandResponseInputError(
                f"{path}: {col} {raw[col][_row_of(frame, bad)]!r} is not a finite number"
            )
    for col in ("pool_id", "resource_class"):
        if frame[col].is_null().any() or (frame[col].str.strip_chars() == "").any():
            raise DemandResponseInputError(f"{path}: empty {col}")
    for col, bad_rows, rule in (
        ("price", frame.filter(pl.col("price") <= 0), "must be > 0 (the fit is in log price)"),
        ("demand", frame.filter(pl.col("demand") < 0), "must be >= 0"),
    ):
        if bad_rows.height:
            raise DemandResponseInputError(
                f"{path}: {col} {raw[col][_row_of(frame, bad_rows.head(1))]!r} {rule}"
                f" ({bad_rows.height} row(s))"
            )
    unknown = sorted(set(frame["resource_class"].unique().to_list()) - set(RESOURCE_CLASSES))
    if unknown:
        raise DemandResponseInputError(
            f"{path}: resource_class {unknown[0]!r} is not one of {', '.join(RESOURCE_CLASSES)}"
        )
    dup = frame.select("ts", "pool_id", "resource_class").is_duplicated()
    if dup.any():
        row = frame.filter(dup).row(0, named=True)
        raise DemandResponseInputError(
            f"{path}: two rows for {row['pool_id']}/{row['resource_class']} at {row['ts']}"
        )
    return frame.select(COLUMNS).cast(HISTORY_SCHEMA)


def _row_of(frame: pl.DataFrame, bad: pl.DataFrame) -> int:
    return int(
        frame.with_row_index().join(
            bad.with_row_index("_b").select("_b", *COLUMNS).head(1), on=list(COLUMNS), nulls_equal=True
        )["index"][0]
    )


def fit_history(
    history: pl.DataFrame,
    *,
    priors: Mapping[str, tuple[float, float]] | None = None,
    level: float = 0.8,
    lag_hours: float = 0.0,
    daily_cycle: bool = False,
    structure_alpha: float = STRUCTURE_ALPHA,
) -> dict[str, ResponseFit]:
    """The fit of every pool x class in `history` (columns as `HISTORY_SCHEMA`, optionally
    `load`), keyed "<pool_id>/<resource_class>"; `priors` by the same key."""
    out: dict[str, ResponseFit] = {}
    for (pool_id, cls), part in sorted(history.group_by("pool_id", "resource_class"), key=lambda kv: kv[0]):
        key = f"{pool_id}/{cls}"
        ts = part["ts"].dt.epoch("us").to_numpy() / 1e6
        load = part["load"].to_numpy() if "load" in part.columns else None
        out[key] = fit_elasticity(
            ts,
            part["price"].to_numpy(),
            part["demand"].to_numpy(),
            pool_id=pool_id,
            resource_class=cls,
            load=load,
            prior=(priors or {}).get(key),
            level=level,
            lag_hours=lag_hours,
            daily_cycle=daily_cycle,
            structure_alpha=structure_alpha,
        )
    return out


def warehouse_history(store: Warehouse, start: datetime, end: datetime) -> pl.DataFrame:
    """Hourly (price, demand) per pool x class from the warehouse: GPU-hours sold per class in
    each hour (`usage_intervals`) at the price in force at the hour's start (`price_book`)."""
    frame = readers.class_demand_by_hour(store, start, end)
    frame = frame.filter(pl.col("price").is_not_null())
    return frame.select(COLUMNS).cast(HISTORY_SCHEMA) if frame.height else pl.DataFrame(schema=HISTORY_SCHEMA)
