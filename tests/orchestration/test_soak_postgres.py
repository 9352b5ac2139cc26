"""A short soak: the loop on dagster-postgres, every schedule and sensor on, the fleet on the
accelerated clock (`market-pipeline bench soak --minutes 0.01 --min-steps 2 --json`, in its own
process: the runs execute in the soak's process and must load the definitions for the soak's
home). The soak's minutes run out within its first step; `--min-steps` makes it go on to the
second, so the test judges a known amount of work (two daemon steps), not the machine's speed.
A longer soak is `bench soak`'s job (docs/orchestration.md), not the suite's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from market_pipeline.fleet.history import HISTORY_START_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_two_step_soak_loses_nothing_and_repeats_nothing():
    psycopg2 = pytest.importorskip("psycopg2")
    from assets.harness.soak import PG_ADMIN_URL

    try:
        psycopg2.connect(PG_ADMIN_URL).close()
    except psycopg2.OperationalError:
        pytest.skip("PostgreSQL is not running on 127.0.0.1:5432")
    # the partitions begin at the twin's epoch, not at the suite's pinned start
    env = {k: v for k, v in os.environ.items() if k != HISTORY_START_ENV and not k.startswith("MP__")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "market_pipeline.cli",
            "bench",
            "soak",
            "--minutes",
            "0.01",
            "--min-steps",
            "2",
            "--json",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["runs"] >= 3 and result["steps"] >= 2, result
    for key in ("failed_runs", "skipped_ticks", "duplicate_actions", "lock_errors", "lost_rows"):
        assert result[key] == 0, (key, result)
    assert 0 < result["tick_p50_s"] <= result["tick_p95_s"], result
    admin = psycopg2.connect(PG_ADMIN_URL)  # the database made for the soak is gone
    cursor = admin.cursor()
    cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'mp_soak_%%'")
    leftover = [row[0] for row in cursor.fetchall()]
    admin.close()
    assert len(leftover) <= 1, leftover  # at most a soak running beside this test
