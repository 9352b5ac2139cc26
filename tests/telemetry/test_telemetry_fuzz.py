"""Fuzz: thousands of generated bad rows of every kind; nothing lost, nothing crashes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl

from market_pipeline.lab.telemetry.synthetic import FLEET_START, fleet_samples
from market_pipeline.telemetry.ingest import ingest_samples
from market_pipeline.telemetry.rules import ValidationPolicy
from market_pipeline.warehouse import open_warehouse

PER_KIND = 2_000
NOW = FLEET_START + timedelta(hours=3)


def _spoil(
    text: pl.DataFrame, rows: np.ndarray, column: str, values: list[str | None], rng: np.random.Generator
) -> pl.DataFrame:
    picked = rng.choice(values, size=rows.size).tolist()
    series = text.get_column(column).to_list()
    for row, value in zip(rows.tolist(), picked):
        series[row] = value
    return text.with_columns(pl.Series(column, series, dtype=pl.Utf8))


# kind -> (column, as-read values, reason that must be among the row's reasons)
KINDS: dict[str, tuple[str, list[str | None], str]] = {
    "nan": ("sm_util_pct", ["nan", "NaN", "-nan"], "sm_util_pct:not_finite"),
    "inf": ("power_w", ["inf", "-inf", "Infinity"], "power_w:not_finite"),
    "text_number": ("temp_c", ["hot", "12,5", "0x1F", "--"], "temp_c:not_a_number"),
    "empty_key": ("node_id", ["", " ", "\t", None], "node_id:missing"),
    "empty_uuid": ("gpu_uuid", ["", None], "gpu_uuid:missing"),
    "bad_ts": ("ts", ["2024-13-45T00:00:00", "soon", "12/31/2023 25:00"], "ts:unparseable"),
    "future_ts": ("ts", ["2031-01-01T00:00:00Z", "2099-06-01 12:00:00"], "ts:in_future"),
    "range": ("sm_util_pct", ["101", "-3", "1e6"], "sm_util_pct:out_of_range"),
    "index": ("gpu_index", ["1.5", "gpu0", "-2"], "gpu_index:"),
}


def test_telemetry_fuzzed_bad_rows_are_all_accounted_for(tmp_path: Path) -> None:
    rng = np.random.default_rng(20240101)
    good_rows = 24_000
    frame = fleet_samples(good_rows, nodes=50, gpus_per_node=8)
    text = frame.with_columns(pl.all().cast(pl.Utf8))
    extra = text.sample(PER_KIND * len(KINDS), seed=3, with_replacement=True)
    # Copies of real rows under fresh keys, so that each is wrong only in its spoiled field;
    # the whole stream is shuffled, so rows arrive late and out of order.
    extra = extra.with_columns(
        (pl.col("gpu_uuid") + pl.lit("-late-") + pl.int_range(pl.len()).cast(pl.Utf8)).alias("gpu_uuid")
    )
    spoiled = extra
    expected: dict[int, str] = {}
    for k, (kind, (column, values, reason)) in enumerate(KINDS.items()):
        rows = np.arange(k * PER_KIND, (k + 1) * PER_KIND)
        spoiled = _spoil(spoiled, rows, column, values, rng)
        expected.update({good_rows + int(r): reason for r in rows})
    duplicates = text.sample(PER_KIND, seed=5)  # exact copies of good rows
    stream = pl.concat([text, spoiled, duplicates])
    order = rng.permutation(stream.height)
    stream = stream[pl.Series(order)]

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    report = ingest_samples(warehouse, stream, source="fuzz", policy=ValidationPolicy(now=NOW))

    assert report.rows_in == stream.height
    assert report.clean + report.quarantined == report.rows_in
    stored = warehouse.query(
        "SELECT (SELECT count(*) FROM telemetry_clean), (SELECT count(*) FROM telemetry_quarantine)"
    ).row(0)
    assert stored == (report.clean, report.quarantined)
    assert report.by_reason.get("row:duplicate") == PER_KIND
    quarantined = warehouse.query("SELECT source_row, reasons FROM telemetry_quarantine")
    reasons_at = dict(
        zip(quarantined.get_column("source_row").to_list(), quarantined.get_column("reasons").to_list())
    )
    position = {int(original): new for new, original in enumerate(order.tolist())}
    for original, reason in expected.items():
        found = reasons_at.get(position[original] + 1)
        assert found is not None and any(r.startswith(reason) for r in found), (original, found)
    # Every good row survives exactly once; no row is clean twice.
    assert report.clean == good_rows
    assert (
        warehouse.query("SELECT count(DISTINCT (node_id, gpu_uuid, ts)) FROM telemetry_clean").item()
        == good_rows
    )
