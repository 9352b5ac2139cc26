"""great-expectations 1.x over one in-memory frame, as a plain function: the harness the
telemetry rules and the decision checks share (an ephemeral context, one suite, a summary
per expectation that an operator reads as a table)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

# Keep GX offline and quiet: no usage statistics, no progress bars on stderr.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


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
            lines.append(
                f"| {rule.expectation} | {rule.column} | {'yes' if rule.success else 'NO'}"
                f" | {rule.unexpected} | {examples} |"
            )
        return "\n".join(lines)


def validate_frame(frame: pl.DataFrame, expectations: Sequence[object], suite_name: str) -> RulesReport:
    """Validate `frame` against `expectations` (gxe.* objects) in an ephemeral GX context."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    started = time.perf_counter()
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch_definition = (
        context.data_sources.add_pandas(suite_name)
        .add_dataframe_asset(f"{suite_name}_frame")
        .add_batch_definition_whole_dataframe("whole")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=suite_name))
    for expectation in expectations:
        suite.add_expectation(expectation)
    batch = batch_definition.get_batch(batch_parameters={"dataframe": frame.to_pandas()})
    result = batch.validate(suite, result_format="SUMMARY")
    outcomes = tuple(_outcome(item) for item in result.results)
    return RulesReport(rows=frame.height, rules=outcomes, seconds=time.perf_counter() - started)


def _outcome(item: object) -> RuleOutcome:
    config = item.expectation_config
    kwargs = config.kwargs
    column = kwargs.get("column") or ",".join(
        kwargs.get("column_list") or [kwargs.get("column_A", ""), kwargs.get("column_B", "")]
    )
    result = item.result or {}
    unexpected = result.get("unexpected_count")
    if unexpected is None:  # aggregate expectations (column max) report an observed value
        unexpected = 0 if item.success else 1
        examples = (str(result.get("observed_value")),) if "observed_value" in result else ()
    else:
        examples = tuple(str(v) for v in (result.get("partial_unexpected_list") or [])[:5])
    if item.exception_info and item.exception_info.get("raised_exception"):
        examples = (str(item.exception_info.get("exception_message")),)
    return RuleOutcome(
        expectation=config.type,
        column=column,
        success=bool(item.success),
        unexpected=int(unexpected),
        examples=examples,
    )
