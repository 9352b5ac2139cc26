"""`bench scale`'s whole-tick mode on a tiny spot-format fleet: two lanes, one tick each, on one
real dagster-celery worker (RabbitMQ), the lakes and control state in PostgreSQL. The bench's
accounting must find nothing lost or stored twice and no failed run on the lane left alone,
and must find the one row a tick lost on the other lane: after its tick, the test hook deletes
one clean telemetry row of the hour from that lane's lake, as a writer that lost a row would
leave it."""

from __future__ import annotations

from pathlib import Path

import pytest

# A spot-trace node list (gpu_model, gpu_capacity_num, cpu_num, node_name), six nodes.
TINY_FLEET = """gpu_model,gpu_capacity_num,cpu_num,node_name
GPU-series-1,4,192,0
GPU-series-1,1,192,1
GPU-series-1,2,96,2
GPU-series-2,8,128,3
GPU-series-2,1,96,4
GPU-series-1,4,192,5
"""
BROKEN_LANE = 1


def lose_one_clean_row(lane: int, store, hour: str) -> None:
    """The tick of lane BROKEN_LANE loses one clean telemetry row of its hour."""
    if lane != BROKEN_LANE:
        return
    store.execute(
        "DELETE FROM telemetry_clean WHERE partition_key = ? AND (gpu_uuid, ts) IN "
        "(SELECT gpu_uuid, ts FROM telemetry_clean WHERE partition_key = ? ORDER BY gpu_uuid, ts LIMIT 1)",
        [hour, hour],
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_whole_ticks_account_for_every_row_and_find_the_one_lost(tmp_path: Path) -> None:
    psycopg2 = pytest.importorskip("psycopg2")
    from assets.harness.scale_ticks import WholeTickSettings, run_whole_tick_bench
    from assets.harness.soak import PG_ADMIN_URL
    from market_pipeline.warehouse import WarehouseError
    from market_pipeline.warehouse.lake import extension_directory

    try:
        psycopg2.connect(PG_ADMIN_URL).close()
        extension_directory()
    except (psycopg2.OperationalError, WarehouseError) as exc:
        pytest.skip(f"no PostgreSQL or DuckLake here: {exc}")
    fleet = tmp_path / "nodes.csv"
    fleet.write_text(TINY_FLEET)

    result = run_whole_tick_bench(
        WholeTickSettings(
            fleet_source=str(fleet), workers=(1,), lanes=2, ticks=1, after_tick=lose_one_clean_row
        )
    )

    run = result["runs"]["1"]
    assert run["errors"] == [] and run["failed_runs"] == 0
    assert run["ticks"] == 2 and run["runs"] == 8  # 2 lanes x 1 tick x 4 jobs, each run once
    clean_lane, broken_lane = run["per_lane"]
    assert clean_lane == {"ticks": 1, "lost_rows": 0, "duplicate_decisions": 0}
    assert broken_lane == {"ticks": 1, "lost_rows": 1, "duplicate_decisions": 0}
    assert result["lost_rows"] == 1 and result["duplicate_decisions"] == 0
    assert result["within_target"] is False
    # where the CPU went while the clock ran: the steps on the worker; the drivers only launch
    # runs and follow them (their definitions were loaded before the clock started)
    cpu = run["cpu_seconds"]
    assert set(cpu) == {"drivers", "workers", "postgres_server", "rabbitmq_server"}
    assert 0 < cpu["drivers"] < cpu["workers"], cpu
    assert result["cpu_seconds_per_tick"]["1"]["workers"] == pytest.approx(cpu["workers"] / 2, abs=0.01)
