"""A short soak: the loop on dagster-postgres, every schedule and sensor on, the fleet on the
accelerated clock (`market-pipeline bench soak --minutes 1`)."""

from __future__ import annotations

import pytest

from market_pipeline.fleet.history import HISTORY_START_ENV


@pytest.mark.postgres
def test_a_one_minute_soak_loses_nothing_and_repeats_nothing(monkeypatch):
    psycopg2 = pytest.importorskip("psycopg2")
    from sensors.soak import PG_ADMIN_URL, run_soak

    try:
        psycopg2.connect(PG_ADMIN_URL).close()
    except psycopg2.OperationalError:
        pytest.skip("PostgreSQL is not running on 127.0.0.1:5432")
    monkeypatch.delenv(HISTORY_START_ENV, raising=False)  # the partitions begin at the twin's epoch
    result = run_soak(1.0)
    assert result.runs >= 3 and result.steps >= 2, result
    assert result.failed_runs == 0, result
    assert result.skipped_ticks == 0, result
    assert result.duplicate_actions == 0, result
    assert result.lock_errors == 0, result
    assert result.lost_rows == 0, result
    assert 0 < result.tick_p50_s <= result.tick_p95_s, result
    # the database made for the soak is gone
    admin = psycopg2.connect(PG_ADMIN_URL)
    cursor = admin.cursor()
    cursor.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'mp_soak_%%'")
    leftover = cursor.fetchone()[0]
    admin.close()
    assert leftover <= 1  # at most a soak running beside this test
