"""Row validation: every reason fires on its own input, duplicates keep the first copy."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from market_pipeline.lab.telemetry.synthetic import FLEET_START, fleet_samples
from market_pipeline.telemetry.partitions import partition_window
from market_pipeline.telemetry.rules import (
    REASONS,
    ValidationPolicy,
    count_reasons,
    reasons_expr,
    screen,
)
from market_pipeline.telemetry.schema import coerce_samples

NOW = FLEET_START + timedelta(hours=2)
POLICY = ValidationPolicy(now=NOW)


def reasons_by_row(frame: pl.DataFrame, policy: ValidationPolicy = POLICY) -> dict[int, list[str]]:
    screening = screen(coerce_samples(frame), policy)
    names = (
        pl.DataFrame({"bits": pl.Series(screening.bad_bits, dtype=pl.UInt64)})
        .select(reasons_expr("bits"))
        .to_series()
        .to_list()
    )
    return dict(zip(screening.bad_rows.tolist(), names))


def good(rows: int = 16) -> pl.DataFrame:
    return fleet_samples(rows, nodes=2, gpus_per_node=8)


def with_value(frame: pl.DataFrame, column: str, row: int, value: object) -> pl.DataFrame:
    values = frame.get_column(column).to_list()
    values[row] = value
    dtype = frame.schema[column] if value is None or not isinstance(value, str) else pl.Utf8
    return frame.with_columns(pl.Series(column, values, dtype=dtype, strict=False))


def test_telemetry_clean_input_has_no_reasons() -> None:
    assert reasons_by_row(good(160)) == {}


@pytest.mark.parametrize(
    "column, value, reason",
    [
        ("sm_util_pct", float("nan"), "sm_util_pct:not_finite"),
        ("sm_util_pct", 100.5, "sm_util_pct:out_of_range"),
        ("sm_util_pct", -0.1, "sm_util_pct:out_of_range"),
        ("power_w", float("inf"), "power_w:not_finite"),
        ("power_w", -1.0, "power_w:out_of_range"),
        ("temp_c", 111.0, "temp_c:out_of_range"),
        ("temp_c", None, "temp_c:missing"),
        ("mem_used_mib", -5.0, "mem_used_mib:out_of_range"),
        ("mem_used_mib", 1e9, "mem_used_mib:above_total"),
        ("mem_total_mib", 0.0, "mem_total_mib:out_of_range"),
        ("gpu_index", -1, "gpu_index:out_of_range"),
        ("gpu_index", None, "gpu_index:missing"),
        ("node_id", "", "node_id:missing"),
        ("node_id", "   ", "node_id:missing"),
        ("gpu_uuid", None, "gpu_uuid:missing"),
        ("xid_errors", -2, "xid_errors:out_of_range"),
        ("ts", None, "ts:missing"),
        ("ts", NOW + timedelta(minutes=10), "ts:in_future"),
    ],
)
def test_telemetry_each_rule_names_its_reason(column: str, value: object, reason: str) -> None:
    frame = with_value(good(), column, 3, value)
    assert reasons_by_row(frame) == {3: [reason]}


def test_telemetry_text_in_numeric_fields_is_not_a_number() -> None:
    frame = good().with_columns(pl.col("power_w").cast(pl.Utf8), pl.col("gpu_index").cast(pl.Utf8))
    frame = with_value(with_value(frame, "power_w", 2, "high"), "gpu_index", 5, "one")
    assert reasons_by_row(frame) == {2: ["power_w:not_a_number"], 5: ["gpu_index:not_an_integer"]}


def test_telemetry_clock_skew_inside_the_allowance_is_accepted() -> None:
    frame = with_value(good(), "ts", 1, NOW + timedelta(seconds=119))
    assert reasons_by_row(frame) == {}
    strict = ValidationPolicy(now=NOW, clock_skew=timedelta(seconds=60))
    assert reasons_by_row(frame, strict) == {1: ["ts:in_future"]}


def test_telemetry_window_quarantines_late_and_early_rows() -> None:
    window = partition_window("2024-01-01-00:00")
    frame = with_value(with_value(good(), "ts", 0, window.start - timedelta(seconds=1)), "ts", 1, window.end)
    policy = ValidationPolicy(now=NOW, window=window)
    assert reasons_by_row(frame, policy) == {0: ["ts:outside_partition"], 1: ["ts:outside_partition"]}


def test_telemetry_exact_duplicates_keep_the_first_copy_clean() -> None:
    frame = good(16)
    copies = pl.concat([frame, frame.slice(2, 3), frame.slice(2, 1)])
    found = reasons_by_row(copies)
    assert found == {
        16: ["row:duplicate"],
        17: ["row:duplicate"],
        18: ["row:duplicate"],
        19: ["row:duplicate"],
    }


def test_telemetry_conflicting_key_keeps_the_first_reading() -> None:
    frame = good(16)
    conflict = frame.slice(4, 1).with_columns(pl.lit(1.0).alias("sm_util_pct"))
    found = reasons_by_row(pl.concat([frame, conflict]))
    assert found == {16: ["key:duplicate"]}


def test_telemetry_a_broken_first_copy_does_not_hide_a_good_second_one() -> None:
    frame = good(16)
    broken = with_value(frame, "sm_util_pct", 0, float("nan"))
    found = reasons_by_row(pl.concat([broken, frame.slice(0, 1)]))
    assert found == {0: ["sm_util_pct:not_finite"]}  # row 16, the good copy, is clean


def test_telemetry_unknown_gpus_only_with_an_inventory() -> None:
    frame = with_value(good(), "gpu_uuid", 0, "GPU-stranger")
    frame = with_value(frame, "gpu_uuid", 1, frame.get_column("gpu_uuid")[2] + "/3")  # MIG child
    assert reasons_by_row(frame) == {}
    inventory = frozenset(good().get_column("gpu_uuid").to_list())
    found = reasons_by_row(frame, ValidationPolicy(now=NOW, known_gpu_uuids=inventory))
    assert found == {0: ["gpu_uuid:unknown"]}
    assert reasons_by_row(frame, ValidationPolicy(now=NOW, known_gpu_uuids=frozenset())) == {}


def test_telemetry_several_reasons_on_one_row_are_all_reported() -> None:
    frame = with_value(with_value(good(), "temp_c", 7, -40.0), "power_w", 7, float("nan"))
    assert reasons_by_row(frame) == {7: ["power_w:not_finite", "temp_c:out_of_range"]}


def test_telemetry_reason_counts_count_rows_per_reason() -> None:
    bits = np.array([0b1, 0b11, 0b10], dtype=np.uint64)
    assert count_reasons(bits) == {REASONS[0]: 2, REASONS[1]: 2}


def test_telemetry_policy_reads_the_typed_config() -> None:
    from market_pipeline.config import TelemetryConfig

    policy = ValidationPolicy.from_config(
        TelemetryConfig(clock_skew_seconds=5, temp_max_c=90), now=datetime(2024, 1, 1, tzinfo=timezone.utc)
    )
    assert policy.clock_skew == timedelta(seconds=5) and policy.temp_max_c == 90
    assert policy.known_gpu_uuids is None


def test_telemetry_keys_with_leading_space_are_odd_but_not_missing() -> None:
    frame = with_value(with_value(good(), "node_id", 2, " node-7"), "gpu_uuid", 4, "\x01id")
    frame = with_value(frame, "gpu_uuid", 5, "\n\t ")
    assert reasons_by_row(frame) == {5: ["gpu_uuid:missing"]}
