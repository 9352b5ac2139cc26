"""The README's first command: the control loop on its embedded default, end to end.

One simulated hour through real Dagster runs on SQLite storage, in a fresh home, as
`make demo` runs it; then the warehouse it leaves is checked for every stage of the loop."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from market_pipeline.warehouse import Warehouse

REPO_ROOT = Path(__file__).resolve().parents[2]
# every test reads the demo the module runs once: about two minutes on the shared cores
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("demo_home")
    dagster_home = home / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    env = {
        **{k: v for k, v in os.environ.items() if k != "MARKET_PIPELINE_HISTORY_START"},
        "MARKET_PIPELINE_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
    }
    done = subprocess.run(
        [sys.executable, "-m", "assets.harness.demo", "--days", str(1 / 24)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
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
    assert count("SELECT count(*) FROM price_book WHERE source IN ('solver', 'shield', 'promises')") > 0
    assert count("SELECT count(*) FROM decisions WHERE kind = 'scale'") > 0
    assert count("SELECT count(*) FROM fct_invoice_lines") > 0
    billed = store.query("SELECT sum(billed_cost) FROM fct_invoice_lines").row(0)[0]
    assert billed is not None and billed > 0


def test_no_approved_drain_expired_before_it_ran(demo_home):
    """A drain decided at a tick runs in that tick's drain run: its age is read on the fleet's
    clock (the twin's, a week back), never the wall clock, which would expire every one."""
    home, _ = demo_home
    store = Warehouse(home / "var" / "warehouse.duckdb")
    ran = store.query("SELECT count(DISTINCT drain_id) FROM drain_audit").row(0)[0]
    expired = store.query(
        "SELECT count(*) FROM drain_audit WHERE state = 'aborted' AND (detail->>'reason') LIKE 'expired%'"
    ).row(0)[0]
    assert ran > 0 and expired == 0, (ran, expired)


def test_published_prices_keep_every_promise(demo_home):
    """The price book carries the shielded price with the list and the solver's price beside
    it, and every published price keeps the step (from the price in force, the base price
    before the first tick), the guaranteed cap and the drainable band."""
    from market_pipeline.config import load_config

    home, _ = demo_home
    market = load_config(environ={}).market
    store = Warehouse(home / "var" / "warehouse.duckdb")
    book = store.query(
        "SELECT effective_from, pool_id, resource_class, price_per_gpu_hour::DOUBLE AS price, "
        "list_price_per_gpu_hour::DOUBLE AS list, solver_price_per_gpu_hour::DOUBLE AS solver, "
        "source, intervention_reason FROM price_book ORDER BY pool_id, resource_class, effective_from"
    )
    assert book.filter(book["source"] != "config").height > 0
    assert book["list"].null_count() == 0 and book["intervention_reason"].null_count() == 0
    for (pool, cls), rows in book.group_by(["pool_id", "resource_class"]):
        prices = rows["price"].to_list()
        for before, after in zip(prices, prices[1:]):
            assert abs(after / before - 1) <= market.max_price_step + 1e-6, (pool, cls, before, after)
        if cls == "guaranteed":
            assert (rows["price"] <= rows["list"] * market.guaranteed_price_cap + 1e-6).all()
    ticks = store.query("SELECT pool_id, guaranteed, drainable FROM market_ticks")
    ratio = 1 - ticks["drainable"] / ticks["guaranteed"]
    assert (
        (ratio >= market.drainable_discount_min - 1e-9) & (ratio <= market.drainable_discount_max + 1e-9)
    ).all()


def test_every_demo_run_went_through_the_instance_under_its_job_schedule_sensor_or_backfill(demo_home):
    """No orphan runs: each run has its job's origin (the code location's job, so the UI lists
    it under the job and re-executes the same version), was launched by a schedule, a sensor
    or a backfill, and carries the simulated tick it serves; the schedules' ticks are stored."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef
    from dagster._core.scheduler.instigation import InstigatorType, TickStatus

    home, _ = demo_home
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home / "dagster_home")))
    runs = instance.get_runs()
    assert runs
    launched_by = {"dagster/schedule_name", "dagster/sensor_name", "dagster/backfill"}
    for run in runs:
        assert run.remote_job_origin is not None, run.job_name
        assert run.remote_job_origin.location_name == "market_pipeline"
        assert launched_by & set(run.tags), (run.job_name, run.tags)
        assert "market_pipeline/tick" in run.tags, (run.job_name, run.tags)
        assert run.status == dg.DagsterRunStatus.SUCCESS, run.job_name
    jobs = {run.job_name for run in runs}
    assert {"telemetry_job", "metering_job", "control_loop_job"} <= jobs
    # billing: a job backfill over the demo's hours, one ranged run of billing_job (its Runs tab lists it)
    backfilled = [run for run in runs if "dagster/backfill" in run.tags]
    assert len(backfilled) == 1 and backfilled[0].job_name == "billing_job"
    assert "dagster/asset_partition_range_start" in backfilled[0].tags
    [backfill] = instance.get_backfills()
    assert backfill.status.value == "COMPLETED_SUCCESS"
    schedules = {
        state.instigator_name: state
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE)
    }
    # the demo leaves its schedules stopped: `make ui` over this instance only looks
    assert not any(state.is_running for state in schedules.values())
    tick = schedules["control_loop_tick"]
    ticks = instance.get_ticks(tick.instigator_origin_id, tick.selector_id)
    assert any(t.status == TickStatus.SUCCESS and t.run_ids for t in ticks)
    # the control tick serves the simulated hour, in the fleet's time, not the wall clock's
    served = {run.tags["market_pipeline/tick"] for run in runs if run.job_name == "control_loop_job"}
    epoch = (
        Warehouse(home / "var" / "warehouse.duckdb").query("SELECT min(ts) FROM telemetry_clean").row(0)[0]
    )
    assert all(abs((dt.datetime.fromisoformat(t) - epoch).total_seconds()) <= 3600 for t in served), served


SNAPSHOT_IDS = """
import json
from sensors.definitions import defs
print(json.dumps({name: defs.resolve_job_def(name).get_job_snapshot_id() for name in
                  ("telemetry_job", "metering_job", "control_loop_job", "drain_job", "scaling_actions_job",
                   "demand_response_job")}))
"""


def test_the_ui_re_executes_demo_runs_as_the_same_version(demo_home):
    """The job snapshots of the demo's runs are the ones `make ui` loads (its environment: no
    demo tick override), so re-execute does not warn of a different version."""
    import json

    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    home, _ = demo_home
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "MARKET_PIPELINE_HISTORY_START" and not k.startswith("MP__")
    }
    env.update(MARKET_PIPELINE_HOME=str(home), DAGSTER_HOME=str(home / "dagster_home"))
    done = subprocess.run(
        [sys.executable, "-c", SNAPSHOT_IDS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    current = json.loads(done.stdout.strip().splitlines()[-1])
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home / "dagster_home")))
    runs = [run for run in instance.get_runs() if run.job_name in current]
    assert {run.job_name for run in runs} >= {"telemetry_job", "metering_job", "control_loop_job"}
    for run in runs:
        assert run.job_snapshot_id == current[run.job_name], run.job_name
