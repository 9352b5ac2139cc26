"""Ingestion: idempotent per partition and source, raw = clean + quarantined, no duplicates."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.lab.telemetry.synthetic import FLEET_START, fleet_samples
from market_pipeline.telemetry.ingest import ingest_samples, known_gpu_uuids
from market_pipeline.telemetry.partitions import partition_key_of, partition_window
from market_pipeline.telemetry.rules import ValidationPolicy
from market_pipeline.telemetry.schema import MissingColumnsError
from market_pipeline.warehouse import Warehouse, open_warehouse

NOW = FLEET_START + timedelta(hours=6)
POLICY = ValidationPolicy(now=NOW)


@pytest.fixture()
def warehouse(migrated_warehouse: Warehouse) -> Warehouse:
    return migrated_warehouse


def counts(warehouse: Warehouse) -> dict[str, int]:
    row = warehouse.query(
        "SELECT (SELECT count(*) FROM telemetry_clean), (SELECT count(*) FROM telemetry_quarantine),"
        " (SELECT count(*) FROM telemetry_raw)"
    ).row(0)
    return {"clean": row[0], "quarantined": row[1], "raw": row[2]}


def two_hours() -> pl.DataFrame:
    """4 GPUs sampled every 15 minutes for two hours: 32 rows in two partitions."""
    return fleet_samples(32, nodes=1, gpus_per_node=4, step_seconds=900)


def test_telemetry_reingesting_a_source_replaces_its_partitions(warehouse: Warehouse) -> None:
    frame = two_hours()
    first = ingest_samples(warehouse, frame, source="file:a", policy=POLICY)
    second = ingest_samples(warehouse, frame, source="file:a", policy=POLICY)
    assert (
        first.summary() == second.summary() == {"rows_in": 32, "clean": 32, "quarantined": 0, "by_reason": {}}
    )
    assert first.partitions == ("2024-01-01-00:00", "2024-01-01-01:00")
    assert counts(warehouse) == {"clean": 32, "quarantined": 0, "raw": 32}
    ledger = warehouse.query("SELECT partition_key, rows_in, ingest_id FROM telemetry_ingests ORDER BY 1")
    assert ledger.get_column("rows_in").to_list() == [16, 16]
    assert set(ledger.get_column("ingest_id")) == {second.ingest_id}


def test_telemetry_late_rows_from_another_file_do_not_wipe_a_partition(warehouse: Warehouse) -> None:
    frame = two_hours()
    first_hour = frame.filter(pl.col("ts") < FLEET_START + timedelta(hours=1))
    ingest_samples(warehouse, first_hour.head(12), source="file:hour0", policy=POLICY)
    late = first_hour.tail(4)  # arrives with the next hour's file
    second = pl.concat([late, frame.filter(pl.col("ts") >= FLEET_START + timedelta(hours=1))])
    report = ingest_samples(warehouse, second, source="file:hour1", policy=POLICY)
    assert report.clean == 20 and report.partitions == ("2024-01-01-00:00", "2024-01-01-01:00")
    per_partition = warehouse.query(
        "SELECT partition_key, count(*) AS n FROM telemetry_clean GROUP BY 1 ORDER BY 1"
    )
    assert per_partition.get_column("n").to_list() == [16, 16]  # no gap, no duplicate


def test_telemetry_a_key_already_delivered_by_another_source_is_quarantined(warehouse: Warehouse) -> None:
    frame = two_hours()
    ingest_samples(warehouse, frame.head(8), source="file:a", policy=POLICY)
    report = ingest_samples(warehouse, frame.head(10), source="file:b", policy=POLICY)
    assert report.clean == 2 and report.by_reason == {"key:already_ingested": 8}
    unique = warehouse.query(
        "SELECT count(*) = count(DISTINCT (node_id, gpu_uuid, ts)) FROM telemetry_clean"
    ).item()
    assert unique and counts(warehouse)["clean"] == 10


def test_telemetry_window_ingest_keeps_every_row_in_its_partition(warehouse: Warehouse) -> None:
    window = partition_window("2024-01-01-00:00")
    policy = ValidationPolicy(now=NOW, window=window)
    report = ingest_samples(warehouse, two_hours(), source="adapter", policy=policy)
    assert (report.clean, report.quarantined) == (16, 16)
    assert report.by_reason == {"ts:outside_partition": 16}
    assert warehouse.query("SELECT DISTINCT partition_key FROM telemetry_quarantine").item() == window.key


def test_telemetry_empty_window_is_still_recorded_and_clears_old_rows(warehouse: Warehouse) -> None:
    window = partition_window("2024-01-01-00:00")
    policy = ValidationPolicy(now=NOW, window=window)
    frame = two_hours().filter(pl.col("ts") < window.end)
    ingest_samples(warehouse, frame, source="adapter", policy=policy)
    report = ingest_samples(warehouse, frame.head(0), source="adapter", policy=policy)
    assert report.rows_in == 0 and report.partitions == (window.key,)
    assert counts(warehouse)["clean"] == 0
    assert warehouse.query("SELECT rows_in FROM telemetry_ingests").item() == 0


def test_telemetry_quarantine_keeps_the_row_as_read_with_its_reasons(warehouse: Warehouse) -> None:
    frame = two_hours().with_columns(pl.col("power_w").cast(pl.Utf8))
    frame = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 5)
        .then(pl.lit("lots"))
        .otherwise(pl.col("power_w"))
        .alias("power_w")
    )
    report = ingest_samples(warehouse, frame, source="file:x", policy=POLICY)
    assert report.summary()["by_reason"] == {"power_w:not_a_number": 1}
    row = warehouse.query("SELECT source_row, power_w, reasons FROM telemetry_quarantine").row(0)
    assert row == (6, "lots", ["power_w:not_a_number"])
    ledger = json.loads(
        warehouse.query("SELECT by_reason FROM telemetry_ingests WHERE quarantined > 0").item()
    )
    assert ledger == {"power_w:not_a_number": 1}


@pytest.mark.parametrize(
    ("nested", "text"),
    [
        (pl.concat_list(pl.col("power_w"), pl.lit(300.5)), "[{w}, 300.5]"),
        (pl.struct(pl.col("power_w").alias("w"), pl.lit("W").alias("unit")), "{{'w': {w}, 'unit': 'W'}}"),
    ],
    ids=["list", "struct"],
)
def test_telemetry_quarantine_keeps_a_nested_value_and_the_timestamp_as_text(
    warehouse: Warehouse, nested: pl.Expr, text: str
) -> None:
    """A JSON source can carry a list or an object where a number belongs: the row is
    quarantined with the value written out whole (not a polars table), its timestamp to the
    microsecond with its zone, and the ingest warns nothing into the operator's log."""
    frame = two_hours()
    watts = frame.get_column("power_w")[5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = ingest_samples(
            warehouse, frame.with_columns(nested.alias("power_w")), source="file:x", policy=POLICY
        )
    assert report.by_reason == {"power_w:not_a_number": 32}
    row = warehouse.query(
        "SELECT ts, power_w, sm_util_pct, reasons FROM telemetry_quarantine WHERE source_row = 6"
    ).row(0)
    assert row[0] == frame.get_column("ts")[5].isoformat(sep=" ", timespec="microseconds")
    assert row[1] == text.format(w=repr(watts))
    assert float(row[2]) == frame.get_column("sm_util_pct")[5]
    assert row[3] == ["power_w:not_a_number"]


def test_telemetry_rows_without_time_land_in_the_files_earliest_hour(warehouse: Warehouse) -> None:
    frame = two_hours().with_columns(
        pl.when(pl.int_range(pl.len()) == 30).then(None).otherwise(pl.col("ts")).alias("ts")
    )
    report = ingest_samples(warehouse, frame, source="file:x", policy=POLICY)
    assert report.by_reason == {"ts:missing": 1}
    assert warehouse.query("SELECT partition_key FROM telemetry_quarantine").item() == partition_key_of(
        FLEET_START
    )


def test_telemetry_missing_columns_write_nothing(warehouse: Warehouse) -> None:
    with pytest.raises(MissingColumnsError, match="temp_c"):
        ingest_samples(warehouse, two_hours().drop("temp_c"), source="file:x", policy=POLICY)
    assert counts(warehouse) == {"clean": 0, "quarantined": 0, "raw": 0}


def test_telemetry_known_gpus_come_from_the_fleet_inventory(warehouse: Warehouse) -> None:
    assert known_gpu_uuids(warehouse) == frozenset()
    warehouse.append(
        "fleet_gpus",
        pl.DataFrame(
            {
                "gpu_uuid": ["GPU-1"],
                "node_id": ["n"],
                "gpu_index": [0],
                "gpu_model": ["A10"],
                "memory_total_mib": [24576],
                "observed_at": [NOW],
            },
            schema_overrides={"gpu_index": pl.Int32, "memory_total_mib": pl.Int32},
        ),
    )
    assert known_gpu_uuids(warehouse) == frozenset({"GPU-1"})


@pytest.mark.parametrize(
    ("stage", "defect"),
    [
        ("_clean_frame", lambda frame: frame.head(frame.height - 1)),  # loses a clean row
        ("_quarantine_frame", lambda frame: frame.head(frame.height - 1)),  # loses a quarantined row
        ("_clean_frame", lambda frame: pl.concat([frame, frame.head(1)])),  # counts a row twice
    ],
)
def test_telemetry_a_stage_that_loses_or_adds_a_row_is_refused_and_writes_nothing(
    warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch, stage: str, defect
) -> None:
    """rows in = clean + quarantined, or the ingest is a defect: it fails naming the counts and
    the warehouse keeps what it had."""
    import market_pipeline.telemetry.ingest as ingest

    frame = two_hours().with_columns(
        pl.when(pl.int_range(pl.len()) < 3).then(None).otherwise(pl.col("gpu_uuid")).alias("gpu_uuid")
    )  # 3 rows without a GPU id are quarantined, 29 are clean
    before = ingest_samples(warehouse, frame, source="file:a", policy=POLICY)
    assert (before.clean, before.quarantined) == (29, 3)
    real = getattr(ingest, stage)
    monkeypatch.setattr(ingest, stage, lambda *args: defect(real(*args)))
    with pytest.raises(
        ingest.TelemetryAccountingError, match=r"ingest of file:a: 32 rows in, \d+ clean \+ \d+ quarantined"
    ):
        ingest_samples(warehouse, frame, source="file:a", policy=POLICY)
    assert counts(warehouse) == {"clean": 29, "quarantined": 3, "raw": 32}
    ledger = warehouse.query("SELECT sum(rows_in), max(ingest_id) FROM telemetry_ingests").row(0)
    assert ledger == (32, before.ingest_id)


def test_telemetry_each_partitions_ledger_row_adds_up_and_names_its_reasons(warehouse: Warehouse) -> None:
    """Per partition: rows in = clean + quarantined with the reasons counted; a row whose time
    cannot place it (in the future) lands in the file's earliest hour; unknown columns are
    named, not loaded."""
    frame = two_hours().with_columns(
        pl.when(pl.int_range(pl.len()) == 0)
        .then(NOW + timedelta(days=1))
        .otherwise(pl.col("ts"))
        .alias("ts"),
        pl.when(pl.int_range(pl.len()) == 20).then(None).otherwise(pl.col("gpu_uuid")).alias("gpu_uuid"),
        pl.lit("x").alias("note"),
    )
    report = ingest_samples(warehouse, frame, source="file:a", policy=POLICY)
    assert (report.rows_in, report.clean, report.quarantined) == (32, 30, 2)
    assert report.quarantine_rate == 2 / 32 and report.ignored_columns == ("note",)
    assert report.by_reason == {"ts:in_future": 1, "gpu_uuid:missing": 1}
    ledger = warehouse.query(
        "SELECT partition_key, source, rows_in, clean, quarantined, by_reason FROM telemetry_ingests ORDER BY 1"
    ).rows()
    assert ledger == [
        ("2024-01-01-00:00", "file:a", 16, 15, 1, json.dumps({"ts:in_future": 1})),
        ("2024-01-01-01:00", "file:a", 16, 15, 1, json.dumps({"gpu_uuid:missing": 1})),
    ]
    quarantined = warehouse.query(
        "SELECT source_row, partition_key, ingest_id FROM telemetry_quarantine ORDER BY 1"
    ).rows()
    assert quarantined == [
        (1, "2024-01-01-00:00", report.ingest_id),
        (21, "2024-01-01-01:00", report.ingest_id),
    ]


def test_telemetry_rows_no_time_can_place_go_to_the_fallback_hour_or_now(warehouse: Warehouse) -> None:
    future = two_hours().head(4).with_columns(ts=pl.lit(NOW + timedelta(days=2)))
    fallback = FLEET_START + timedelta(hours=3, minutes=20)
    report = ingest_samples(warehouse, future, source="file:f", policy=POLICY, fallback_time=fallback)
    assert report.partitions == (partition_key_of(fallback),) and report.quarantined == 4
    report = ingest_samples(warehouse, future, source="file:g", policy=POLICY)
    assert report.partitions == (partition_key_of(NOW),)
    assert ValidationPolicy(now=NOW) == POLICY and report.summary() == {
        "rows_in": 4,
        "clean": 0,
        "quarantined": 4,
        "by_reason": {"ts:in_future": 4},
    }
    empty = ingest_samples(warehouse, future.head(0), source="file:h", policy=POLICY)
    assert empty.quarantine_rate == 0.0 and empty.partitions == ()


def test_telemetry_a_single_row_another_source_delivered_still_counts(warehouse: Warehouse) -> None:
    """One clean row from another source is enough to make its key taken; a source whose rows
    in that partition were all quarantined takes no key."""
    frame = two_hours()
    ingest_samples(warehouse, frame.head(1), source="file:a", policy=POLICY)
    spoiled = frame.slice(1, 1).with_columns(pl.lit("not a number").alias("power_w"))
    ingest_samples(warehouse, spoiled, source="file:c", policy=POLICY)  # quarantined: clean = 0
    report = ingest_samples(warehouse, frame.head(3), source="file:b", policy=POLICY)
    assert report.clean == 2 and report.by_reason == {"key:already_ingested": 1}
    assert counts(warehouse) == {"clean": 3, "quarantined": 2, "raw": 5}


@pytest.mark.usefixtures("host_in_kolkata")
def test_telemetry_the_ledger_stamps_each_ingest_in_utc_on_any_host(warehouse: Warehouse) -> None:
    """`ingested_at` is the UTC instant of the ingest, also on a host whose clock is set to
    another zone (here +05:30): never local wall time read as UTC."""
    from datetime import datetime, timezone

    before = datetime.now(timezone.utc)
    ingest_samples(warehouse, two_hours(), source="file:a", policy=POLICY)
    stamps = warehouse.query("SELECT ingested_at FROM telemetry_ingests").get_column("ingested_at").to_list()
    assert len(stamps) == 2
    assert all(before - timedelta(seconds=1) <= t <= datetime.now(timezone.utc) for t in stamps)


# --- Mutation testing, issue 47 (second helper): what the mutants of ingest.py left standing ---


def test_telemetry_a_fallback_hour_before_1970_is_its_own_hour(warehouse: Warehouse) -> None:
    """Rows no time can place go to the fallback time's hour, counted down to the hour that
    holds it also before the epoch (22:30 on 1969-12-31 is the 22:00 partition, not 23:00)."""
    from datetime import datetime, timezone

    future = two_hours().head(2).with_columns(ts=pl.lit(NOW + timedelta(days=2)))
    fallback = datetime(1969, 12, 31, 22, 30, tzinfo=timezone.utc)
    report = ingest_samples(warehouse, future, source="file:f", policy=POLICY, fallback_time=fallback)
    assert report.partitions == ("1969-12-31-22:00",) and report.quarantined == 2
    keys = warehouse.query("SELECT DISTINCT partition_key FROM telemetry_quarantine").get_column(
        "partition_key"
    )
    assert keys.to_list() == ["1969-12-31-22:00"]


def test_telemetry_a_partition_whose_every_row_was_quarantined_counts_no_clean_row(
    warehouse: Warehouse,
) -> None:
    """The ledger row of a partition that received only quarantined rows says so: rows in =
    quarantined, clean 0 (beside a partition with clean rows, which keeps its own counts)."""
    frame = two_hours().head(4).with_columns(pl.col("power_w").cast(pl.Utf8))
    spoiled = frame.head(3).with_columns(
        pl.lit("not a number").alias("power_w"), pl.col("ts") + timedelta(hours=3)
    )
    ingest_samples(warehouse, pl.concat([frame, spoiled]), source="file:q", policy=POLICY)
    ledger = warehouse.query(
        "SELECT partition_key, rows_in, clean, quarantined FROM telemetry_ingests ORDER BY 1"
    ).rows()
    assert ledger == [("2024-01-01-00:00", 4, 4, 0), ("2024-01-01-03:00", 3, 0, 3)]


def test_telemetry_a_file_missing_a_column_is_refused_naming_the_file(warehouse: Warehouse) -> None:
    """The refusal names what was read: the caller's label for it, "input" by default."""
    frame = two_hours().drop("temp_c")
    with pytest.raises(MissingColumnsError, match=r"^input lacks required telemetry column\(s\) temp_c"):
        ingest_samples(warehouse, frame, source="file:x", policy=POLICY)
    with pytest.raises(
        MissingColumnsError, match=r"^samples\.csv lacks required telemetry column\(s\) temp_c"
    ):
        ingest_samples(warehouse, frame, source="file:x", policy=POLICY, where="samples.csv")
    assert counts(warehouse) == {"clean": 0, "quarantined": 0, "raw": 0}


def test_telemetry_naive_times_are_read_in_the_policys_zone(warehouse: Warehouse) -> None:
    """A source whose clock is naive local time (here +01:00 in winter) is ingested clean, each
    row at its UTC instant, when the policy names the zone."""
    frame = two_hours().head(4)
    local = frame.with_columns(pl.col("ts").dt.convert_time_zone("Europe/Berlin").dt.replace_time_zone(None))
    policy = ValidationPolicy(now=NOW, naive_timezone="Europe/Berlin")
    report = ingest_samples(warehouse, local, source="file:n", policy=policy)
    assert (report.clean, report.quarantined) == (4, 0)
    stored = warehouse.query("SELECT ts FROM telemetry_clean ORDER BY ts").get_column("ts").to_list()
    assert stored == frame.get_column("ts").sort().to_list()


def test_telemetry_the_report_names_its_source_and_how_long_it_took(warehouse: Warehouse) -> None:
    """The report the CLI prints ("in 0.12s") and the asset records: its source, and the
    ingest's own duration, within the time the call took."""
    import time

    started = time.perf_counter()
    report = ingest_samples(warehouse, two_hours(), source="file:a", policy=POLICY)
    took = time.perf_counter() - started
    assert report.source == "file:a"
    assert isinstance(report.seconds, float) and 0 < report.seconds <= took


def test_telemetry_ingests_on_a_lake_number_and_replace_as_on_a_file(migrated_lake, tmp_path: Path) -> None:  # noqa: ANN001
    """On the cluster profile's DuckLake an ingest's id is one past the largest recorded (no
    sequences there): a second ingest of the source replaces the first's partitions."""
    store = open_warehouse(tmp_path / "unused.duckdb", lake=migrated_lake)
    first = ingest_samples(store, two_hours(), source="file:a", policy=POLICY)
    second = ingest_samples(store, two_hours(), source="file:a", policy=POLICY)
    assert second.ingest_id == first.ingest_id + 1
    assert counts(store) == {"clean": 32, "quarantined": 0, "raw": 32}


def _ingest_at_the_start_line(lake, source: str, start, out) -> None:  # noqa: ANN001 - a Barrier, a Queue
    store = open_warehouse(Path("unused.duckdb"), migrate=False, lake=lake)
    store.query("SELECT 1")  # attached before the start line
    start.wait(timeout=120)
    report = ingest_samples(store, two_hours(), source=source, policy=POLICY)
    out.put((source, report.ingest_id, report.clean, report.quarantined, report.by_reason))


@pytest.mark.postgres
def test_telemetry_two_ingests_at_once_on_a_lake_lose_nothing_and_deliver_each_key_once(
    migrated_lake,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    """Two machines ingest the same samples from two sources into one DuckLake at the same
    moment: the ingests take turns, so each gets its own id, one delivers every key and the
    other quarantines every key as already delivered (none clean twice, none lost), and the
    ledger adds up for both."""
    store = open_warehouse(tmp_path / "unused.duckdb", lake=migrated_lake)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_ingest_at_the_start_line, args=(migrated_lake, source, start, out))
        for source in ("file:a", "file:b")
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
        assert proc.exitcode == 0, f"ingest {proc.name} exited {proc.exitcode}"
    reports = sorted((out.get(timeout=10) for _ in procs), key=lambda r: r[1])
    assert [r[1] for r in reports] == [1, 2]  # one id each, in the order they committed
    first, second = reports
    assert first[2:] == (32, 0, {})
    assert second[2:] == (0, 32, {"key:already_ingested": 32})
    assert counts(store) == {"clean": 32, "quarantined": 32, "raw": 64}
    assert store.query("SELECT count(DISTINCT (node_id, gpu_uuid, ts)) FROM telemetry_clean").item() == 32
    ledger = store.query(
        "SELECT source, ingest_id, sum(rows_in) AS n, sum(clean) AS c, sum(quarantined) AS q"
        " FROM telemetry_ingests GROUP BY ALL ORDER BY ingest_id"
    ).rows()
    assert ledger == [(first[0], 1, 32, 32, 0), (second[0], 2, 32, 0, 32)]
