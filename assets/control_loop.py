"""The control loop: its jobs and schedules, and `python -m assets.control_loop`, which runs
the loop on the embedded default the way the Dagster daemon would (the README's `make demo`).

Per simulated hour: the telemetry partition (samples + usage intervals), then one control tick
(inventory -> demand -> forecast -> prices -> price book -> scaling plan -> drain requests),
then the sensors' run requests (drains, scaling actions). Billing rolls the day up at the end.
"""

import argparse
import json
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg

from assets.telemetry import TELEMETRY_PARTITIONS
from market_pipeline.config import ConfigError, LoopConfig, load_config
from market_pipeline.loop_summary import wall_summary

# One hour of telemetry and metering per partition.
telemetry_job = dg.define_asset_job(
    "telemetry_job",
    selection=dg.AssetSelection.assets("telemetry_samples", "usage_intervals"),
    partitions_def=TELEMETRY_PARTITIONS,
    description="Ingest and check one hour of per-GPU samples; meter that hour's usage.",
)
telemetry_schedule = dg.build_schedule_from_partitioned_job(
    telemetry_job, name="telemetry_hourly", minute_of_hour=2)

# The repricing tick: inventory -> demand -> forecast -> prices -> price book -> scaling
# plan -> drain requests. Drains and scaling actions run in their own sensor-launched jobs.
control_loop_job = dg.define_asset_job(
    "control_loop_job",
    selection=dg.AssetSelection.groups("fleet", "market", "scaling", "drain"),
    description="One control-loop tick over the whole fleet.",
)


def control_loop_schedule_for(loop: LoopConfig) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="control_loop_tick", job=control_loop_job, cron_schedule=loop.tick_cron,
        description=f"Reprice, plan scaling and request drains every {loop.tick_minutes} minutes "
                    "(loop.tick_minutes).")


# The tick follows loop.tick_minutes (the scaling policy and the backlog certificate are
# sized for that interval); the config rejects a tick that does not divide the hour.
# (the loop section only: the fleet's market is resolved, and checked, when a run starts)
control_loop_schedule = control_loop_schedule_for(load_config(resolve_fleet=False).loop)


def run_control_loop(days: float, instance: dg.DagsterInstance) -> dict:
    """Advance the fleet by `days` simulated days through Dagster runs; return a summary."""
    from market_pipeline.definitions import defs
    from market_pipeline.loop_summary import summarise

    fleet = defs.resources["fleet"]
    adapter = fleet.get()
    start = _hour_floor(_now(adapter))
    wall_limit = _hour_floor(datetime.now(timezone.utc))
    end = min(start + timedelta(days=days), wall_limit)
    if end <= start:
        raise SystemExit(
            f"the simulated fleet's clock ({start.isoformat()}) has caught up with the wall clock; "
            "remove var/ (make clean) to start a new simulated history")
    telemetry_job = defs.resolve_job_def("telemetry_job")
    tick_job = defs.resolve_job_def("control_loop_job")
    began, tick_seconds, hour_seconds = time.perf_counter(), [], []
    hour = start
    while hour < end:
        key = hour.strftime("%Y-%m-%d-%H:%M")
        hour_began = time.perf_counter()
        _check(telemetry_job.execute_in_process(partition_key=key, instance=instance), f"telemetry {key}")
        tick_began = time.perf_counter()
        _check(tick_job.execute_in_process(instance=instance), f"control tick after {key}")
        tick_seconds.append(time.perf_counter() - tick_began)
        _run_sensor_requests(defs, instance)
        hour_seconds.append(time.perf_counter() - hour_began)
        print(f"  simulated {key} UTC ({hour_seconds[-1]:.1f} s)", file=sys.stderr)
        hour += timedelta(hours=1)
    billing = defs.resolve_job_def("billing_job")
    last_hour = (end - timedelta(hours=1)).strftime("%Y-%m-%d-%H:%M")
    _check(billing.execute_in_process(instance=instance, tags={
        "dagster/asset_partition_range_start": start.strftime("%Y-%m-%d-%H:%M"),
        "dagster/asset_partition_range_end": last_hour}), "billing rollup")
    summary = summarise(defs.resources["warehouse"].reader(), fleet.config(), start, end)
    failed = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    return {**summary, "failed_runs": failed,
            "wall": wall_summary(time.perf_counter() - began, tick_seconds, hour_seconds)}


def _run_sensor_requests(defs: dg.Definitions, instance: dg.DagsterInstance) -> None:
    """Evaluate the run-request sensors once and execute what they ask for, in process: one
    run per batch (a tick's drains, a tick's scaling actions). A run key that already has a
    run is skipped, as the daemon would."""
    for sensor_name in ("drain_sensor", "scaling_sensor"):
        sensor = defs.resolve_sensor_def(sensor_name)
        with dg.build_sensor_context(instance=instance, resources=defs.resources,
                                     definitions=defs) as context:
            result = sensor(context)
        requests = result.run_requests if hasattr(result, "run_requests") else list(result or [])
        for request in requests or []:
            if not isinstance(request, dg.RunRequest) or _run_key_used(instance, request.run_key):
                continue
            job = defs.resolve_job_def(sensor.job_name)
            tags = {**(request.tags or {}), "dagster/run_key": request.run_key or ""}
            run = job.execute_in_process(run_config=request.run_config, instance=instance, tags=tags,
                                         raise_on_error=False)
            if not run.success:
                print(f"  {sensor.job_name} run {request.run_key} failed; see the run in the Dagster UI",
                      file=sys.stderr)


def _run_key_used(instance: dg.DagsterInstance, run_key: str | None) -> bool:
    return bool(run_key) and bool(instance.get_run_ids(
        filters=dg.RunsFilter(tags={"dagster/run_key": run_key}), limit=1))


def _check(result: dg.ExecuteInProcessResult, what: str) -> None:
    if not result.success:
        raise SystemExit(f"{what} failed; see the run in the Dagster UI")


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
    instance = dg.DagsterInstance.get()
    summary = run_control_loop(args.days, instance)
    from market_pipeline.loop_summary import render

    print(render(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, default=str))
    if summary["failed_runs"]:
        print(f"error: {summary['failed_runs']} run(s) failed; see them in the Dagster UI", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
