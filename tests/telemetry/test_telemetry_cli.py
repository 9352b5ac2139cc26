"""`market-pipeline telemetry ingest|check` and `bench ingest` through the real CLI parser."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.cli import main
from market_pipeline.lab.telemetry.synthetic import fleet_samples
from market_pipeline.warehouse import Warehouse

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_metrics.txt"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out  # exactly one JSON object on stdout
    return code, json.loads(out[0])


def test_telemetry_cli_ingests_csv_with_bad_rows_idempotently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = fleet_samples(64, nodes=1, gpus_per_node=8).with_columns(pl.all().cast(pl.Utf8))
    frame = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("n/a")).otherwise(pl.col("temp_c")).alias("temp_c"),
        pl.when(pl.int_range(pl.len()) == 4).then(pl.lit("")).otherwise(pl.col("gpu_uuid")).alias("gpu_uuid"),
    )
    csv = tmp_path / "samples.csv"
    pl.concat([frame, frame.slice(10, 2)]).write_csv(csv)
    warehouse = str(tmp_path / "w.duckdb")
    args = ("telemetry", "ingest", "--file", str(csv), "--warehouse", warehouse, "--json")
    code, first = run_json(capsys, *args)
    assert code == 0
    assert first == {
        "rows_in": 66,
        "clean": 62,
        "quarantined": 4,
        "by_reason": {"temp_c:not_a_number": 1, "gpu_uuid:missing": 1, "row:duplicate": 2},
    }
    assert run_json(capsys, *args) == (0, first)
    stored = Warehouse(Path(warehouse)).query(
        "SELECT (SELECT count(*) FROM telemetry_clean), (SELECT count(*) FROM telemetry_quarantine)"
    )
    assert stored.row(0) == (62, 4)


def test_telemetry_cli_ingests_a_dcgm_file_without_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_json(
        capsys,
        "telemetry",
        "ingest",
        "--file",
        str(FIXTURE),
        "--warehouse",
        str(tmp_path / "w.duckdb"),
        "--json",
    )
    assert (code, report) == (0, {"rows_in": 5, "clean": 5, "quarantined": 0, "by_reason": {}})


def test_telemetry_cli_names_missing_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "thin.csv"
    csv.write_text("ts,node_id,gpu_uuid\n2024-01-01T00:00:00Z,n1,GPU-1\n")
    code, report = run_json(
        capsys, "telemetry", "ingest", "--file", str(csv), "--warehouse", str(tmp_path / "w.duckdb"), "--json"
    )
    assert code == 2 and "gpu_index" in report["error"] and "temp_c" in report["error"]


def test_telemetry_cli_bench_reports_both_rates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_json(
        capsys, "bench", "ingest", "--rows", "20000", "--dir", str(tmp_path), "--repeats", "1", "--json"
    )
    assert code == 0
    assert set(report) == {"rows", "seconds", "rows_per_s", "raw_append_rows_per_s", "ratio"}
    assert report["rows"] == 20000 and report["rows_per_s"] > 0
    assert report["ratio"] == pytest.approx(report["rows_per_s"] / report["raw_append_rows_per_s"], rel=0.01)
