"""The README's first command: the control loop on its embedded default, end to end.

One simulated hour through real Dagster runs on SQLite storage, in a fresh home, as
`make demo` runs it; then the warehouse it leaves is checked for every stage of the loop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from market_pipeline.warehouse import Warehouse

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("demo_home")
    dagster_home = home / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    env = {**os.environ, "MARKET_PIPELINE_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
    done = subprocess.run([sys.executable, "-m", "assets.control_loop", "--days", str(1 / 24)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return home, done.stdout


def test_demo_prints_the_loop_summary(demo_home):
    _, summary = demo_home
    for line in ("Control loop:", "solves", "prices now", "decisions", "billed", "warehouse"):
        assert line in summary, summary


def test_every_stage_of_the_loop_left_rows(demo_home):
    home, _ = demo_home
    store = Warehouse(home / "var" / "warehouse.duckdb")

    def count(sql: str) -> int:
        return int(store.query(sql).row(0)[0])

    assert count("SELECT count(*) FROM telemetry_clean") > 0
    assert count("SELECT count(*) FROM usage_intervals") > 0
    assert count("SELECT count(*) FROM demand_forecasts") > 0
    assert count("SELECT count(*) FROM solve_reports WHERE converged") >= 1
    assert count("SELECT count(*) FROM price_book WHERE source = 'solver'") > 0
    assert count("SELECT count(*) FROM decisions WHERE kind = 'scale'") > 0
    assert count("SELECT count(*) FROM fct_invoice_lines") > 0
    billed = store.query("SELECT sum(billed_cost) FROM fct_invoice_lines").row(0)[0]
    assert billed is not None and billed > 0
