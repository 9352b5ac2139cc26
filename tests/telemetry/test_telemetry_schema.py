"""Coercion of telemetry as read into SAMPLE_SCHEMA, and file reading errors."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.hardware.protocol import SAMPLE_SCHEMA
from market_pipeline.telemetry.schema import (
    MissingColumnsError,
    UnreadableFileError,
    coerce_samples,
    read_sample_file,
    unparsed_flag,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_metrics.txt"


def text_frame(**overrides: list) -> pl.DataFrame:
    base = {
        "ts": ["2024-03-01T10:00:00Z"],
        "node_id": ["n1"],
        "gpu_uuid": ["GPU-1"],
        "gpu_index": ["0"],
        "sm_util_pct": ["50"],
        "mem_used_mib": ["10"],
        "mem_total_mib": ["100"],
        "power_w": ["300"],
        "temp_c": ["60"],
    }
    base.update(overrides)
    height = max(len(v) for v in base.values())
    return pl.DataFrame({k: (v * height if len(v) == 1 else v) for k, v in base.items()})


def test_telemetry_missing_columns_error_names_each_missing_column() -> None:
    frame = text_frame().drop("power_w", "temp_c")
    with pytest.raises(MissingColumnsError) as caught:
        coerce_samples(frame, where="upload.csv")
    message = str(caught.value)
    assert "upload.csv" in message and "power_w" in message and "temp_c" in message
    assert caught.value.missing == ["power_w", "temp_c"]
    assert isinstance(caught.value, ValueError)


def test_telemetry_text_numbers_parse_and_bad_text_is_flagged_not_dropped() -> None:
    frame = text_frame(sm_util_pct=[" 12.5 ", "nan", "inf", "abc", "", "1e1"])
    coerced = coerce_samples(frame)
    assert coerced.typed.schema["sm_util_pct"] == pl.Float64
    values = coerced.typed.get_column("sm_util_pct").to_list()
    assert values[0] == 12.5 and values[5] == 10.0
    assert values[1] != values[1]  # NaN survives coercion; validation owns it
    assert values[2] == float("inf")
    assert values[3] is None and values[4] is None
    flags = coerced.typed.get_column(unparsed_flag("sm_util_pct")).to_list()
    assert flags == [False, False, False, True, False, False]  # blank is missing, not bad text
    assert coerced.height == 6


def test_telemetry_integer_columns_reject_fractions_and_text() -> None:
    frame = text_frame(gpu_index=["3", "3.0", "3.5", "x", "-1"])
    typed = coerce_samples(frame).typed
    assert typed.schema["gpu_index"] == pl.Int32
    assert typed.get_column("gpu_index").to_list() == [3, 3, None, None, -1]
    assert typed.get_column(unparsed_flag("gpu_index")).to_list() == [False, False, True, True, False]


def test_telemetry_timestamps_in_many_spellings_become_utc() -> None:
    frame = text_frame(
        ts=[
            "2024-03-01T10:00:00Z",
            "2024-03-01 10:00:00",
            "2024-03-01T12:00:00+02:00",
            "1709287200",
            "yesterday",
            "",
        ]
    )
    typed = coerce_samples(frame).typed
    assert typed.schema["ts"] == SAMPLE_SCHEMA["ts"]
    expected = datetime(2024, 3, 1, 10, tzinfo=timezone.utc)
    assert typed.get_column("ts").to_list()[:4] == [expected] * 4
    assert typed.get_column("ts").to_list()[4:] == [None, None]
    assert typed.get_column(unparsed_flag("ts")).to_list() == [False] * 4 + [True, False]


def test_telemetry_typed_frames_pass_through_and_naive_datetimes_are_utc() -> None:
    frame = pl.DataFrame(
        {
            "ts": [datetime(2024, 3, 1, 10)],
            "node_id": ["n1"],
            "gpu_uuid": ["GPU-1"],
            "gpu_index": pl.Series([0], dtype=pl.Int64),
            "sm_util_pct": [50],
            "mem_used_mib": [1.0],
            "mem_total_mib": [2.0],
            "power_w": [1.0],
            "temp_c": [40.0],
            "extra": ["ignored"],
        }
    )
    coerced = coerce_samples(frame)
    assert coerced.typed.row(0, named=True)["ts"] == datetime(2024, 3, 1, 10, tzinfo=timezone.utc)
    assert coerced.typed.schema["sm_util_pct"] == pl.Float64
    assert coerced.typed.get_column("mig_profile").to_list() == [None]  # optional column added
    assert coerced.ignored_columns == ("extra",)


def test_telemetry_csv_and_parquet_files_read_the_same(tmp_path: Path) -> None:
    frame = text_frame(sm_util_pct=["50", "oops"])
    frame.write_csv(tmp_path / "s.csv")
    frame.write_parquet(tmp_path / "s.parquet")
    from_csv = read_sample_file(tmp_path / "s.csv")
    from_parquet = read_sample_file(tmp_path / "s.parquet")
    assert from_csv.get_column("sm_util_pct").to_list() == ["50", "oops"]
    assert from_csv.equals(from_parquet)


def test_telemetry_dcgm_text_file_is_recognised(tmp_path: Path) -> None:
    frame = read_sample_file(FIXTURE)
    assert frame.height == 5 and set(SAMPLE_SCHEMA) == set(frame.columns)


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("missing.csv", None, "does not exist"),
        ("binary.csv", b"\x00\x01\x02garbage", "binary"),
        ("table.xlsx", b"PK\x03\x04", "unknown format"),
        ("broken.parquet", b"PAR1 this is not parquet", "cannot parse"),
        (
            "broken.txt",
            b'# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0" 12\n',
            "cannot parse",
        ),
    ],
)
def test_telemetry_unreadable_files_raise_a_clear_error(
    tmp_path: Path, name: str, content: bytes | None, problem: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UnreadableFileError) as caught:
        read_sample_file(path)
    assert name in str(caught.value) and problem in str(caught.value)
