"""great-expectations 1.x rules over a partition's clean samples, as a plain function.

Validation at ingest already keeps bad rows out of the clean table; these rules re-check
what is actually stored (a second, independent implementation), so a defect in ingest or a
write from another path shows up as a failed check instead of bad prices downstream.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from market_pipeline.gx_frame import RuleOutcome, RulesReport, validate_frame
from market_pipeline.telemetry.rules import MIG_INSTANCE_SEPARATOR

__all__ = ["RuleLimits", "RuleOutcome", "RulesReport", "run_clean_rules"]

_FLOAT_MAX = sys.float_info.max  # an upper bound that only +inf exceeds


@dataclass(frozen=True)
class RuleLimits:
    now: datetime
    clock_skew: timedelta
    temp_min_c: float
    temp_max_c: float
    known_gpu_uuids: frozenset[str] | None = None  # None or empty: rule off
    # fields the source declared unmeasured: null allowed there, values still range-checked
    unmeasured: frozenset[str] = frozenset()


def run_clean_rules(clean: pl.DataFrame, limits: RuleLimits) -> RulesReport:
    """Run the expectation suite on `clean` (SAMPLE_SCHEMA columns) with an ephemeral context."""
    frame = _with_inventory_column(clean, limits.known_gpu_uuids)
    expectations = _expectations(limits)
    if frame.is_empty():
        # no row, no newest timestamp: GX reads the max of nothing as NaT and fails it (an hour
        # the adapter delivered nothing in is the freshness check's to report, not a defect)
        expectations = [e for e in expectations if type(e).__name__ != "ExpectColumnMaxToBeBetween"]
    # Int64: GX vectorises range checks only on int64/float64 columns (else a Python loop).
    return validate_frame(
        frame.with_columns(pl.col("gpu_index").cast(pl.Int64)), expectations, "telemetry_clean"
    )


def _expectations(limits: RuleLimits) -> list[object]:
    import great_expectations.expectations as gxe

    expectations: list[object] = [
        gxe.ExpectColumnValuesToNotBeNull(column=column)
        for column in (
            "ts",
            "node_id",
            "gpu_uuid",
            "gpu_index",
            "sm_util_pct",
            "mem_used_mib",
            "mem_total_mib",
            "power_w",
            "temp_c",
        )
        if column not in limits.unmeasured
    ]
    expectations += [
        gxe.ExpectColumnValueLengthsToBeBetween(column="node_id", min_value=1),
        gxe.ExpectColumnValueLengthsToBeBetween(column="gpu_uuid", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="gpu_index", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="sm_util_pct", min_value=0, max_value=100),
        gxe.ExpectColumnValuesToBeBetween(column="mem_used_mib", min_value=0, max_value=_FLOAT_MAX),
        gxe.ExpectColumnValuesToBeBetween(
            column="mem_total_mib", min_value=0, strict_min=True, max_value=_FLOAT_MAX
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="mem_total_mib",
            column_B="mem_used_mib",
            or_equal=True,
            # a not-reported used memory has nothing to compare (the not-null rule owns a
            # missing one where it is measured)
            ignore_row_if="either_value_is_missing",
        ),
        gxe.ExpectColumnValuesToBeBetween(column="power_w", min_value=0, max_value=_FLOAT_MAX),
        gxe.ExpectColumnValuesToBeBetween(
            column="temp_c", min_value=limits.temp_min_c, max_value=limits.temp_max_c
        ),
        gxe.ExpectColumnMaxToBeBetween(column="ts", max_value=limits.now + limits.clock_skew),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["node_id", "gpu_uuid", "ts"]),
    ]
    if limits.known_gpu_uuids:
        expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=INVENTORY_COLUMN))
    return expectations


INVENTORY_COLUMN = "inventory_gpu_uuid"


def _with_inventory_column(clean: pl.DataFrame, known: frozenset[str] | None) -> pl.DataFrame:
    """Referential integrity as data: the inventory's UUID for each row's GPU (null: unknown).

    A MIG instance ("<GPU UUID>/<instance>") resolves through its parent GPU. Joining here and
    expecting non-null keeps the inventory out of the expectation's config, which GX copies
    many times per run (an 8,000-UUID value set cost more than all other rules together).
    """
    if not known:
        return clean
    inventory = pl.DataFrame({INVENTORY_COLUMN: sorted(known)})
    parent = pl.col("gpu_uuid").str.split(MIG_INSTANCE_SEPARATOR).list.first()
    return (
        clean.with_columns(parent.alias("_parent"))
        .join(
            inventory,
            left_on="_parent",
            right_on=INVENTORY_COLUMN,
            how="left",
            coalesce=False,
            maintain_order="left",
        )
        .drop("_parent")
    )
