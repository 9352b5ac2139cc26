"""great-expectations 1.x rules over a partition's clean samples, as a plain function.

Validation at ingest already keeps bad rows out of the clean table; these rules re-check
what is actually stored (a second, independent implementation), so a defect in ingest or a
write from another path shows up as a failed check instead of bad prices downstream.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from market_pipeline.telemetry.rules import MIG_INSTANCE_SEPARATOR

# Keep GX offline and quiet: no usage statistics, no progress bars on stderr.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

_FLOAT_MAX = sys.float_info.max  # an upper bound that only +inf exceeds


@dataclass(frozen=True)
class RuleOutcome:
    expectation: str
    column: str
    success: bool
    unexpected: int
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class RulesReport:
    rows: int
    rules: tuple[RuleOutcome, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(rule.success for rule in self.rules)

    @property
    def failed(self) -> tuple[RuleOutcome, ...]:
        return tuple(rule for rule in self.rules if not rule.success)

    def markdown(self) -> str:
        lines = ["| rule | column | passed | unexpected | examples |", "|---|---|---|---|---|"]
        for rule in self.rules:
            examples = ", ".join(rule.examples[:3]).replace("|", "\\|")
            lines.append(f"| {rule.expectation} | {rule.column} | {'yes' if rule.success else 'NO'}"
                         f" | {rule.unexpected} | {examples} |")
        return "\n".join(lines)


@dataclass(frozen=True)
class RuleLimits:
    now: datetime
    clock_skew: timedelta
    temp_min_c: float
    temp_max_c: float
    known_gpu_uuids: frozenset[str] | None = None  # None or empty: rule off


def run_clean_rules(clean: pl.DataFrame, limits: RuleLimits) -> RulesReport:
    """Run the expectation suite on `clean` (SAMPLE_SCHEMA columns) with an ephemeral context."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    started = time.perf_counter()
    frame = _with_inventory_column(clean, limits.known_gpu_uuids)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch_definition = (
        context.data_sources.add_pandas("telemetry")
        .add_dataframe_asset("clean_samples")
        .add_batch_definition_whole_dataframe("partition")
    )
    suite = context.suites.add(gx.ExpectationSuite(name="telemetry_clean"))
    for expectation in _expectations(limits):
        suite.add_expectation(expectation)
    # Int64: GX vectorises range checks only on int64/float64 columns (else a Python loop).
    pandas_frame = frame.with_columns(pl.col("gpu_index").cast(pl.Int64)).to_pandas()
    batch = batch_definition.get_batch(batch_parameters={"dataframe": pandas_frame})
    result = batch.validate(suite, result_format="SUMMARY")
    outcomes = tuple(_outcome(item) for item in result.results)
    return RulesReport(rows=clean.height, rules=outcomes, seconds=time.perf_counter() - started)


def _expectations(limits: RuleLimits) -> list[object]:
    import great_expectations.expectations as gxe

    expectations: list[object] = [
        gxe.ExpectColumnValuesToNotBeNull(column=column)
        for column in ("ts", "node_id", "gpu_uuid", "gpu_index", "sm_util_pct", "mem_used_mib",
                       "mem_total_mib", "power_w", "temp_c")
    ]
    expectations += [
        gxe.ExpectColumnValueLengthsToBeBetween(column="node_id", min_value=1),
        gxe.ExpectColumnValueLengthsToBeBetween(column="gpu_uuid", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="gpu_index", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="sm_util_pct", min_value=0, max_value=100),
        gxe.ExpectColumnValuesToBeBetween(column="mem_used_mib", min_value=0, max_value=_FLOAT_MAX),
        gxe.ExpectColumnValuesToBeBetween(column="mem_total_mib", min_value=0, strict_min=True,
                                          max_value=_FLOAT_MAX),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="mem_total_mib",
                                                    column_B="mem_used_mib", or_equal=True),
        gxe.ExpectColumnValuesToBeBetween(column="power_w", min_value=0, max_value=_FLOAT_MAX),
        gxe.ExpectColumnValuesToBeBetween(column="temp_c", min_value=limits.temp_min_c,
                                          max_value=limits.temp_max_c),
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
    return (clean.with_columns(parent.alias("_parent"))
            .join(inventory, left_on="_parent", right_on=INVENTORY_COLUMN, how="left",
                  coalesce=False, maintain_order="left")
            .drop("_parent"))


def _outcome(item: object) -> RuleOutcome:
    config = item.expectation_config
    kwargs = config.kwargs
    column = kwargs.get("column") or ",".join(
        kwargs.get("column_list") or [kwargs.get("column_A", ""), kwargs.get("column_B", "")])
    result = item.result or {}
    unexpected = result.get("unexpected_count")
    if unexpected is None:  # aggregate expectations (column max) report an observed value
        unexpected = 0 if item.success else 1
        examples = (str(result.get("observed_value")),) if "observed_value" in result else ()
    else:
        examples = tuple(str(v) for v in (result.get("partial_unexpected_list") or [])[:5])
    if item.exception_info and item.exception_info.get("raised_exception"):
        examples = (str(item.exception_info.get("exception_message")),)
    return RuleOutcome(expectation=config.type, column=column, success=bool(item.success),
                       unexpected=int(unexpected), examples=examples)
