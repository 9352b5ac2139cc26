"""The loop's schedules: the hour they ask for, the tick they tag, when they are on."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime

import dagster as dg
import pytest

from assets.lib.schedules import LIVE_ENV, closed_hour_key, hourly_partition_schedule
from assets.lib.tags import TICK_TAG
from assets.telemetry.jobs import telemetry_job
from market_pipeline.config import load_config


def _evaluate(schedule: dg.ScheduleDefinition, when: datetime):
    from sensors.definitions import defs

    with dg.build_schedule_context(
        scheduled_execution_time=when, repository_def=defs.get_repository_def()
    ) as context:
        return schedule.evaluate_tick(context)


def test_an_hourly_schedule_asks_for_the_hour_that_closed_and_tags_its_tick():
    schedule = hourly_partition_schedule(
        telemetry_job, "t", 0, "d", first_hour=datetime(2026, 11, 1, tzinfo=UTC), priority=1
    )
    data = _evaluate(schedule, datetime(2026, 11, 3, 5, 0, tzinfo=UTC))
    [request] = data.run_requests
    assert request.partition_key == "2026-11-03-04:00" == request.run_key
    assert request.tags[TICK_TAG] == "2026-11-03T05:00:00+00:00"
    assert request.tags["dagster/priority"] == "1"
    assert closed_hour_key(datetime(2026, 11, 3, 0, 15, tzinfo=UTC)) == "2026-11-02-23:00"


def test_an_hour_before_the_fleets_history_is_skipped_with_its_reason():
    schedule = hourly_partition_schedule(
        telemetry_job, "t", 0, "d", first_hour=datetime(2026, 11, 1, tzinfo=UTC)
    )
    data = _evaluate(schedule, datetime(2026, 11, 1, 0, 0, tzinfo=UTC))
    assert not data.run_requests and "before the fleet's history" in data.skip_message


def test_the_control_tick_and_the_daily_billing_carry_the_tick_they_serve():
    from sensors.definitions import defs

    when = datetime(2026, 11, 3, 0, 40, tzinfo=UTC)
    [tick] = _evaluate(defs.resolve_schedule_def("control_loop_tick"), when).run_requests
    assert tick.tags[TICK_TAG] == when.isoformat() and tick.run_key == when.isoformat()
    [daily] = _evaluate(defs.resolve_schedule_def("billing_daily_schedule"), when).run_requests
    assert daily.tags[TICK_TAG] == when.isoformat()
    assert daily.tags["dagster/asset_partition_range_start"] == "2026-11-02-00:00"


def test_schedules_are_off_unless_live_and_on_when_live(monkeypatch):
    import assets.lib.schedules as schedules
    from sensors.definitions import loop_schedules

    monkeypatch.delenv(LIVE_ENV, raising=False)
    assert schedules.default_status() == dg.DefaultScheduleStatus.STOPPED
    assert {s.default_status for s in loop_schedules(load_config())} == {dg.DefaultScheduleStatus.STOPPED}
    monkeypatch.setenv(LIVE_ENV, "1")
    assert schedules.default_status() == dg.DefaultScheduleStatus.RUNNING
    assert {s.default_status for s in loop_schedules(load_config())} == {dg.DefaultScheduleStatus.RUNNING}


def test_the_loop_jobs_resolve_without_a_warning():
    """`telemetry_job` used to mix backfill policies (one hour per run and single-run
    metering), and Dagster warned about it at every start."""
    from sensors.definitions import defs

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for name in ("telemetry_job", "metering_job", "control_loop_job", "billing_job"):
            defs.resolve_job_def(name)


@pytest.mark.parametrize("job", ["telemetry_job", "metering_job", "billing_job"])
def test_partitioned_jobs_begin_where_the_fleets_history_begins(job):
    from assets.lib.partitions import HOURLY_PARTITIONS
    from sensors.definitions import defs

    assert defs.resolve_job_def(job).partitions_def == HOURLY_PARTITIONS


def test_the_loops_modules_import_without_a_loadable_config():
    """Nothing runs at import: the jobs, schedules, sensors and asset modules load with a
    config path that does not exist (the schedules' module used to load the config, and fail,
    on import); the config is read when the definitions are composed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import pkgutil, importlib, assets, sensors.drain, sensors.scaling\n"
        "for module in pkgutil.walk_packages(assets.__path__, 'assets.'):\n"
        "    importlib.import_module(module.name)\n"
        "print('loaded')"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": str(root),
            "MARKET_PIPELINE_CONFIG": str(root / "no-such-config.toml"),
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded" in done.stdout


def test_the_configured_tick_sets_the_control_schedule():
    from sensors.definitions import loop_schedules

    three = load_config(environ={"MP__LOOP__TICK_MINUTES": "3"})
    [tick] = [s for s in loop_schedules(three) if s.name == "control_loop_tick"]
    assert tick.cron_schedule == "*/3 * * * *"
