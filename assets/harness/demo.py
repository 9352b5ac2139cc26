"""`python -m assets.harness.demo` (the README's `make demo`): the control loop over simulated
days on the embedded default, through the Dagster instance the way the daemon runs it.

The simulated daemon (assets/harness/sim_daemon.py) fires the loop's schedules on the fleet's clock:
per simulated hour the telemetry and metering partitions of the hour that closed, then the
control tick (inventory -> demand -> forecast -> prices -> price book -> scaling plan -> drain
requests); after each, the sensors' run requests (drains, scaling actions). Billing rolls the
days up at the end as one backfill over their hourly partitions. Every run is queued by its
schedule, sensor or backfill and carries the simulated tick it serves.
"""

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg

from market_pipeline.config import ConfigError, load_config
from market_pipeline.report.loop_summary import wall_summary
from market_pipeline.telemetry.partitions import PARTITION_FORMAT

# The demo's schedules: billing runs as one backfill at the end instead of 24 hourly dbt builds.
DEMO_SCHEDULES = ("telemetry_hourly", "metering_hourly", "control_loop_tick", "demand_response_refit")
# The demand-response refit every 6 simulated hours (live: demand_response.refit_hours, 1), so
# the demo shows the fit and its experiments for a few seconds of a simulated day.
DEMO_REFIT_HOURS = "6"
# One control tick per simulated hour keeps a simulated day within minutes (live, the tick
# follows loop.tick_minutes); set MP__LOOP__TICK_MINUTES to run the demo at another tick.
DEMO_TICK_MINUTES = "60"


def run_control_loop(days: float, dagster_home: Path) -> dict:
    """Advance the fleet by `days` simulated days through the instance; return a summary."""
    from assets.harness.sim_daemon import simulated_daemon, simulated_instance
    from market_pipeline.hardware import make_adapter
    from market_pipeline.report.loop_summary import summarise
    from market_pipeline.warehouse.profile import configured_warehouse

    config = load_config()
    start = _hour_floor(_now(make_adapter(config)))
    wall_limit = _hour_floor(datetime.now(timezone.utc))
    end = min(start + timedelta(days=days), wall_limit)
    if end <= start:
        raise SystemExit(
            f"the simulated fleet's clock ({start.isoformat()}) has caught up with the wall clock; "
            "remove var/ (make clean) to start a new simulated history"
        )
    instance = simulated_instance(dagster_home)
    began, hour_seconds = time.perf_counter(), []
    with simulated_daemon(instance, start) as daemon:
        daemon.turn_on(DEMO_SCHEDULES)
        hour_began = time.perf_counter()
        for at in daemon.fire_times(start, end + timedelta(seconds=1)):
            report = daemon.step(at)
            if at.minute == 0 and at > start:
                hour_seconds.append(time.perf_counter() - hour_began)
                hour_began = time.perf_counter()
                print(
                    f"  simulated {at - timedelta(hours=1):%Y-%m-%d %H:%M} UTC ({hour_seconds[-1]:.1f} s, "
                    f"{len(report.run_ids)} runs at the tick)",
                    file=sys.stderr,
                )
        hours = [
            (start + timedelta(hours=h)).strftime(PARTITION_FORMAT)
            for h in range(int((end - start).total_seconds() // 3600))
        ]
        daemon.backfill("billing_job", hours, title="billing rollup")
        daemon.clock.set(end + timedelta(minutes=5))
        daemon.backfills()
        # stopped again: `make ui` over this instance looks, and its daemon moves nothing
        daemon.turn_on(())
    summary = summarise(configured_warehouse(config), config, start, end)
    failed = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    tick_seconds = [
        record.end_time - record.start_time
        for record in instance.get_run_records(
            dg.RunsFilter(job_name="control_loop_job", statuses=[dg.DagsterRunStatus.SUCCESS])
        )
        if record.start_time and record.end_time
    ]
    return {
        **summary,
        "failed_runs": failed,
        "wall": wall_summary(time.perf_counter() - began, tick_seconds, hour_seconds),
    }


def _now(adapter) -> datetime:
    from market_pipeline.hardware.protocol import adapter_now

    return adapter_now(adapter)


def _hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run the control loop over simulated days")
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--json", help="also write the summary, wall times included, to this JSON file")
    args = parser.parse_args(argv)
    try:
        # before any run or warehouse write: a fleet whose GPU models nobody priced stops here
        load_config()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("MP__LOOP__TICK_MINUTES", DEMO_TICK_MINUTES)
    os.environ.setdefault("MP__DEMAND_RESPONSE__REFIT_HOURS", DEMO_REFIT_HOURS)
    home = os.environ.get("DAGSTER_HOME")
    if not home or not (Path(home) / "dagster.yaml").is_file():
        print(
            "error: set DAGSTER_HOME to a folder holding dagster.yaml (make demo copies the "
            "repository's dagster.yaml to var/dagster_home)",
            file=sys.stderr,
        )
        return 2
    try:
        summary = run_control_loop(args.days, Path(home))
    except (RuntimeError, ValueError) as exc:  # the code location did not load, a stuck backfill
        print(f"error: {' '.join(str(exc).split())[:500]}", file=sys.stderr)
        return 1
    from market_pipeline.report.loop_summary import render

    print(render(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, default=str))
    if summary["failed_runs"]:
        print(f"error: {summary['failed_runs']} run(s) failed; see them in the Dagster UI", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
