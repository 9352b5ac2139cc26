"""`market-pipeline export`: files per billing period, byte-identical reruns, FOCUS metadata,
one-line errors and nothing half-written."""

from __future__ import annotations

import csv
import hashlib
import json
import os

import duckdb
import pytest

from market_pipeline.billing.export import FOCUS_SCHEMA_CREATED, MANIFEST
from market_pipeline.cli import main
from market_pipeline.warehouse import open_warehouse

MARCH = ["--from", "2026-03-01T00:00:00Z", "--to", "2026-04-01T00:00:00Z"]


def export(capsys, warehouse, *args):
    code = main(["export", *args, "--warehouse", str(warehouse.path)])
    out = capsys.readouterr()
    return code, out.out, out.err


def digests(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("what", ["focus", "invoices", "economics"])
def test_export_rerun_writes_byte_identical_files(rated_warehouse, tmp_path, capsys, what, fmt):
    out = tmp_path / "out"
    code, stdout, _ = export(capsys, rated_warehouse, what, *MARCH, "--format", fmt, "--out", str(out))
    assert code == 0 and json.loads(stdout)["rows"] > 0
    first = digests(out)
    assert any(name.startswith("billing_period=2026-03/") and name.endswith(f".{fmt}") for name in first)
    code, _, _ = export(capsys, rated_warehouse, what, *MARCH, "--format", fmt, "--out", str(out))
    assert code == 0 and digests(out) == first
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary directory left behind


def test_export_partitions_by_billing_period_and_keeps_the_window(warehouse_copy, tmp_path, capsys):
    with duckdb.connect(str(warehouse_copy.path)) as con:  # the same lines again, a month later
        con.execute("""INSERT INTO fct_invoice_lines SELECT * REPLACE (
                           invoice_line_id || '+april' AS invoice_line_id,
                           period_start + INTERVAL 31 DAY AS period_start, period_end + INTERVAL 31 DAY AS period_end,
                           period_start_utc + INTERVAL 31 DAY AS period_start_utc)
                       FROM fct_invoice_lines""")
    out = tmp_path / "out"
    code, _, _ = export(
        capsys,
        warehouse_copy,
        "invoices",
        "--from",
        "2026-03-01T00:00:00Z",
        "--to",
        "2026-05-01T00:00:00Z",
        "--out",
        str(out),
    )
    manifest = json.loads((out / MANIFEST).read_text())
    assert code == 0 and [f["billing_period"] for f in manifest["files"]] == ["2026-03", "2026-04"]
    march, april = (list(csv.DictReader(open(out / f["path"]))) for f in manifest["files"])
    assert len(march) == len(april) and all(r["period_start"].startswith("2026-04") for r in april)
    code, _, _ = export(
        capsys,
        warehouse_copy,
        "invoices",
        "--from",
        "2026-03-02T09:00:00Z",
        "--to",
        "2026-03-02T10:00:00Z",
        "--out",
        str(out),
    )
    lines = list(csv.DictReader(open(out / "billing_period=2026-03" / "invoice_lines.csv")))
    assert (
        code == 0 and lines and {r["period_grain"] for r in lines} == {"hour"}
    )  # a day is not inside one hour
    assert {r["period_start"] for r in lines} == {"2026-03-02T09:00:00Z"}


def test_focus_export_writes_schema_metadata_and_focus_date_times(rated_warehouse, tmp_path, capsys):
    out = tmp_path / "focus"
    assert export(capsys, rated_warehouse, "focus", *MARCH, "--out", str(out))[0] == 0
    metadata = json.loads((out / "focus-metadata.json").read_text())
    assert metadata["FocusVersion"] == "1.2" and metadata["DataGenerator"] == "market-pipeline"
    # a column change changes the SchemaId: bump FOCUS_SCHEMA_CREATED with this pin
    assert (metadata["SchemaId"], metadata["CreationDate"]) == (
        "d067c25385dca0a09d7055f34c5807e9",
        FOCUS_SCHEMA_CREATED,
    )
    columns = {c["ColumnName"]: c for c in metadata["ColumnDefinition"]}
    assert columns["BilledCost"] == {
        "ColumnName": "BilledCost",
        "DataType": "DECIMAL",
        "NumericPrecision": 38,
        "NumberScale": 9,
    }
    rows = list(csv.DictReader(open(out / "billing_period=2026-03" / "focus.csv")))
    assert list(rows[0])[:3] == ["AvailabilityZone", "BilledCost", "BillingAccountId"]
    assert all(r["ChargePeriodStart"].endswith(":00:00Z") and "T" in r["ChargePeriodStart"] for r in rows)
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-03-01T00:00:00Z"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "2026-03-02T00:00:00Z", "--to", "2026-03-01T00:00:00Z"], "empty window"),
        (["--from", "2026-03-01T00:30:00Z", "--to", "2026-03-02T00:00:00Z"], "not on a whole UTC hour"),
        (["--from", "last week", "--to", "2026-03-02T00:00:00Z"], "not an ISO time"),
    ],
)
def test_export_refuses_a_bad_window_in_one_line(rated_warehouse, tmp_path, capsys, args, message):
    code, _, err = export(capsys, rated_warehouse, "focus", *args, "--out", str(tmp_path / "out"))
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_unwritable_or_foreign_paths_and_keeps_the_old_export(
    rated_warehouse, tmp_path, capsys
):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        code, _, err = export(capsys, rated_warehouse, "focus", *MARCH, "--out", str(locked / "out"))
        if os.geteuid() != 0:  # root writes anywhere
            assert code == 2 and "not writable" in err and err.count("\n") == 1
    finally:
        os.chmod(locked, 0o700)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = export(capsys, rated_warehouse, "focus", *MARCH, "--out", str(a_file / "out"))
    assert code == 2 and "is not a directory" in err and err.count("\n") == 1
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, _, err = export(capsys, rated_warehouse, "focus", *MARCH, "--out", str(foreign))
    assert code == 2 and "not an export" in err and (foreign / "notes.txt").read_text() == "mine"
    out = tmp_path / "out"
    assert export(capsys, rated_warehouse, "economics", *MARCH, "--out", str(out))[0] == 0
    before = digests(out)
    empty = open_warehouse(tmp_path / "empty.duckdb")  # no marts: the export fails part way
    code, _, err = export(capsys, empty, "economics", *MARCH, "--out", str(out))
    assert code == 2 and "billing-rollup" in err and err.count("\n") == 1
    assert digests(out) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty.duckdb",
        "file",
        "home",
        "locked",
        "out",
    ]
