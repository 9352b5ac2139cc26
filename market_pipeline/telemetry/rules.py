"""Row-level validation of coerced samples: one vectorised pass, a reason bitmask per bad row.

Most rows are good, so the full pass only computes one boolean (`any rule broken`); the
per-reason bits are evaluated on the (small) set of bad rows. Duplicates are found among the
rows that pass every other rule, so a broken first copy never hides a good second one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl

from market_pipeline.telemetry.partitions import PartitionWindow
from market_pipeline.telemetry.schema import (
    FLOAT_COLUMNS,
    KEY_TEXT_COLUMNS,
    NAIVE_FLAG,
    SAMPLE_COLUMNS,
    CoercedSamples,
    unparsed_flag,
)

KEY_COLUMNS: tuple[str, ...] = ("node_id", "gpu_uuid", "ts")
# A MIG instance seen through dcgm-exporter is "<parent GPU UUID>/<GPU instance id>"; it
# exists when its parent GPU is in the fleet inventory.
MIG_INSTANCE_SEPARATOR = "/"
ASCII_WHITESPACE = " \t\n\r\x0b\x0c"

ROW_REASONS: tuple[str, ...] = (
    "ts:missing",
    "ts:unparseable",
    "ts:in_future",
    "ts:outside_partition",
    "node_id:missing",
    "gpu_uuid:missing",
    "gpu_uuid:unknown",
    "gpu_index:missing",
    "gpu_index:not_an_integer",
    "gpu_index:out_of_range",
    *(
        f"{c}:{problem}"
        for c in FLOAT_COLUMNS
        for problem in ("missing", "not_a_number", "not_finite", "out_of_range")
    ),
    "mem_used_mib:above_total",
    "xid_errors:not_an_integer",
    "xid_errors:out_of_range",
    "ts:implausible",
    "ts:naive",
)
# Before this no GPU of the fleet reported telemetry: an earlier time is a broken clock or a
# placeholder (0001-01-01 was ingested as clean into partition 1-01-01-00:00).
EARLIEST_PLAUSIBLE = datetime(2000, 1, 1, tzinfo=timezone.utc)
# Reasons whose timestamp cannot place a row in a partition: it goes to the ingest's home.
UNPLACEABLE_TS: tuple[str, ...] = ("ts:in_future", "ts:implausible", "ts:naive")
DUPLICATE_ROW = "row:duplicate"  # an exact copy of an earlier row: the first copy is clean
DUPLICATE_KEY = "key:duplicate"  # same (node, GPU, ts) as an earlier row, other values
ALREADY_INGESTED = "key:already_ingested"  # the key is already clean from another source
REASONS: tuple[str, ...] = (*ROW_REASONS, DUPLICATE_ROW, DUPLICATE_KEY, ALREADY_INGESTED)
REASON_BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(REASONS)}


@dataclass(frozen=True)
class ValidationPolicy:
    now: datetime
    clock_skew: timedelta = timedelta(seconds=120)
    temp_min_c: float = 0.0
    temp_max_c: float = 110.0
    window: PartitionWindow | None = None  # set: rows must fall in it (one partition)
    known_gpu_uuids: frozenset[str] | None = None  # None or empty: no inventory, rule off
    earliest: datetime = EARLIEST_PLAUSIBLE  # older timestamps are quarantined as implausible
    # naive timestamps: None quarantines them (ts:naive); an IANA zone converts them from it
    naive_timezone: str | None = None
    # fields the source declared it cannot measure (hardware.protocol.unmeasured_fields):
    # null there is "not reported", not missing; a value there is still range-checked
    unmeasured: frozenset[str] = frozenset()

    @classmethod
    def from_config(
        cls,
        telemetry: object,
        now: datetime,
        window: PartitionWindow | None = None,
        known_gpu_uuids: Iterable[str] | None = None,
        unmeasured: Iterable[str] = (),
    ) -> "ValidationPolicy":
        known = frozenset(known_gpu_uuids) if known_gpu_uuids is not None else None
        return cls(
            now=now,
            clock_skew=timedelta(seconds=float(getattr(telemetry, "clock_skew_seconds"))),
            temp_min_c=float(getattr(telemetry, "temp_min_c")),
            temp_max_c=float(getattr(telemetry, "temp_max_c")),
            window=window,
            known_gpu_uuids=known or None,
            naive_timezone=getattr(telemetry, "naive_timezone", None),
            unmeasured=frozenset(unmeasured),
        )


@dataclass(frozen=True)
class Screening:
    """Bad rows by position (sorted) and the reason bits of each."""

    bad_rows: np.ndarray  # uint32 positions into the input
    bad_bits: np.ndarray  # uint64, aligned with bad_rows
    rows: int

    def with_reason(self, positions: np.ndarray, reason: str) -> "Screening":
        """Add `reason` to the rows at `positions` (which may already be bad)."""
        positions = np.unique(positions.astype(np.uint32))
        if positions.size == 0:
            return self
        rows = np.union1d(self.bad_rows, positions).astype(np.uint32)
        bits = np.zeros(rows.size, dtype=np.uint64)
        bits[np.searchsorted(rows, self.bad_rows)] = self.bad_bits
        bits[np.searchsorted(rows, positions)] |= np.uint64(REASON_BIT[reason])
        return Screening(rows, bits, self.rows)

    def good_mask(self) -> np.ndarray:
        mask = np.ones(self.rows, dtype=bool)
        mask[self.bad_rows] = False
        return mask


def reason_exprs(policy: ValidationPolicy, exact: bool = True) -> dict[str, pl.Expr]:
    """Each row reason as a boolean expression over the coerced frame (null = rule holds).

    `exact=False` gives a cheaper screen that may flag more rows than the exact rules (a key
    that merely starts with whitespace); the exact rules then decide on the flagged rows.
    """
    ts = pl.col("ts")
    exprs: dict[str, pl.Expr] = {
        "ts:missing": ts.is_null() & ~pl.col(unparsed_flag("ts")),
        "ts:unparseable": pl.col(unparsed_flag("ts")),
        "ts:in_future": ts > pl.lit(policy.now + policy.clock_skew),
        "ts:implausible": ts < pl.lit(policy.earliest),
        # localize_naive clears the flag when a zone is configured; left up, it is refused
        "ts:naive": pl.col(NAIVE_FLAG),
    }
    if policy.window is not None:
        exprs["ts:outside_partition"] = (ts < pl.lit(policy.window.start)) | (ts >= pl.lit(policy.window.end))
    for column in KEY_TEXT_COLUMNS:
        exprs[f"{column}:missing"] = pl.col(column).is_null() | _blank(column, exact)
    exprs["gpu_index:missing"] = pl.col("gpu_index").is_null() & ~pl.col(unparsed_flag("gpu_index"))
    exprs["gpu_index:not_an_integer"] = pl.col(unparsed_flag("gpu_index"))
    exprs["gpu_index:out_of_range"] = pl.col("gpu_index") < 0
    for column in FLOAT_COLUMNS:
        value = pl.col(column)
        not_reported = pl.lit(column in policy.unmeasured)
        exprs[f"{column}:missing"] = value.is_null() & ~pl.col(unparsed_flag(column)) & ~not_reported
        exprs[f"{column}:not_a_number"] = pl.col(unparsed_flag(column))
        exprs[f"{column}:not_finite"] = ~value.is_finite()
    exprs["sm_util_pct:out_of_range"] = ~pl.col("sm_util_pct").is_between(0.0, 100.0)
    exprs["mem_used_mib:out_of_range"] = pl.col("mem_used_mib") < 0
    exprs["mem_total_mib:out_of_range"] = pl.col("mem_total_mib") <= 0
    exprs["power_w:out_of_range"] = pl.col("power_w") < 0
    exprs["temp_c:out_of_range"] = ~pl.col("temp_c").is_between(policy.temp_min_c, policy.temp_max_c)
    exprs["mem_used_mib:above_total"] = pl.col("mem_used_mib") > pl.col("mem_total_mib")
    exprs["xid_errors:not_an_integer"] = pl.col(unparsed_flag("xid_errors"))
    exprs["xid_errors:out_of_range"] = pl.col("xid_errors") < 0
    # NaN compares false everywhere: the not_finite rule owns it, range rules stay quiet.
    for column in FLOAT_COLUMNS:
        name = f"{column}:out_of_range"
        exprs[name] = exprs[name] & pl.col(column).is_finite()
    # Compared only against a usable total: a broken total is blamed on its own.
    exprs["mem_used_mib:above_total"] = (
        exprs["mem_used_mib:above_total"]
        & pl.col("mem_used_mib").is_finite()
        & pl.col("mem_total_mib").is_finite()
        & (pl.col("mem_total_mib") > 0)
    )
    return {name: expr.fill_null(False) for name, expr in exprs.items()}


def _blank(column: str, exact: bool) -> pl.Expr:
    """Empty or ASCII whitespace only. Such a string sorts before "!" (its first byte is at
    most 0x20), a test ~7x cheaper than stripping every key, so the screen uses that."""
    if not exact:
        return pl.col(column) < "!"
    return pl.col(column).str.strip_chars(ASCII_WHITESPACE).str.len_bytes() == 0


def screen(samples: CoercedSamples, policy: ValidationPolicy) -> Screening:
    """Find every bad row and why; duplicates are judged among otherwise good rows."""
    typed = samples.typed
    cheap = reason_exprs(policy, exact=False)
    any_bad = typed.select(pl.any_horizontal(list(cheap.values())).alias("bad")).to_series()
    flagged = np.flatnonzero(any_bad.to_numpy()).astype(np.uint32)
    bits = _bits_of(typed, flagged, reason_exprs(policy, exact=True))
    bad = bits != 0  # the exact rules clear what the cheap screen over-flagged
    screening = Screening(flagged[bad], bits[bad], typed.height)
    screening = _unknown_gpus(typed, screening, policy)
    return _duplicates(typed, screening)


def _bits_of(typed: pl.DataFrame, rows: np.ndarray, exprs: dict[str, pl.Expr]) -> np.ndarray:
    if rows.size == 0:
        return np.zeros(0, dtype=np.uint64)
    subset = typed[pl.Series(rows)]
    bit_exprs = [
        expr.cast(pl.UInt64) * pl.lit(REASON_BIT[name], dtype=pl.UInt64) for name, expr in exprs.items()
    ]
    return subset.select(pl.sum_horizontal(bit_exprs)).to_series().to_numpy().astype(np.uint64)


def _unknown_gpus(typed: pl.DataFrame, screening: Screening, policy: ValidationPolicy) -> Screening:
    known = policy.known_gpu_uuids
    if not known:
        return screening
    known_series = pl.Series(sorted(known), dtype=pl.Utf8)
    unseen = typed.select(
        (pl.col("gpu_uuid").is_not_null() & ~pl.col("gpu_uuid").is_in(known_series.implode())).alias("unseen")
    ).to_series()
    if not unseen.any():
        return screening
    candidates = typed.filter(unseen).get_column("gpu_uuid").unique().to_list()
    unknown = [u for u in candidates if u.split(MIG_INSTANCE_SEPARATOR, 1)[0] not in known]
    if not unknown:
        return screening
    flags = typed.select(pl.col("gpu_uuid").is_in(pl.Series(unknown).implode())).to_series()
    return screening.with_reason(np.flatnonzero(flags.to_numpy()).astype(np.uint32), "gpu_uuid:unknown")


def _duplicates(typed: pl.DataFrame, screening: Screening) -> Screening:
    """Later copies of a key are quarantined: exact copies as row:duplicate, others key:duplicate."""
    good = screening.good_mask()
    if good.sum() < 2:
        return screening
    # Hash pass on all good rows (cheap, sort-based), exact comparison only on candidates.
    key_hash = typed.select(
        (pl.col("node_id").hash(1) ^ pl.col("gpu_uuid").hash(2) ^ pl.col("ts").hash(3)).alias("h")
    ).to_series()
    good_series = pl.Series(good)
    sorted_hashes = key_hash.filter(good_series).sort()
    repeated = sorted_hashes.filter(sorted_hashes == sorted_hashes.shift(1)).unique()
    if repeated.len() == 0:
        return screening
    candidate = (key_hash.is_in(repeated.implode()) & good_series).to_numpy()
    positions = np.flatnonzero(candidate).astype(np.uint32)
    subset = typed[pl.Series(positions)].select(SAMPLE_COLUMNS)
    flags = subset.select(
        pl.struct(list(KEY_COLUMNS)).is_first_distinct().alias("first_key"),
        pl.struct(list(SAMPLE_COLUMNS)).is_first_distinct().alias("first_row"),
    )
    first_key = flags.get_column("first_key").to_numpy()
    first_row = flags.get_column("first_row").to_numpy()
    screening = screening.with_reason(positions[~first_row], DUPLICATE_ROW)
    return screening.with_reason(positions[~first_key & first_row], DUPLICATE_KEY)


def reasons_expr(bits_column: str) -> pl.Expr:
    """The reason names of a UInt64 bitmask column as a list, in REASONS order."""
    bits = pl.col(bits_column)
    return pl.concat_list(
        [
            pl.when((bits & pl.lit(bit, dtype=pl.UInt64)) != 0).then(pl.lit(name))
            for name, bit in REASON_BIT.items()
        ]
    ).list.drop_nulls()


def count_reasons(bits: np.ndarray) -> dict[str, int]:
    counts = {}
    for name, bit in REASON_BIT.items():
        hits = int(np.count_nonzero(bits & np.uint64(bit)))
        if hits:
            counts[name] = hits
    return counts
