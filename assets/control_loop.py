"""The control loop: its jobs and schedules, and `python -m assets.control_loop`, which runs
the loop on the embedded default the way the Dagster daemon would (the README's `make demo`).

Per simulated hour: the telemetry partition (samples + usage intervals), then one control tick
(inventory -> demand -> forecast -> prices -> price book -> scaling plan -> drain requests),
then the sensors' run requests (drains, scaling actions). Billing rolls the day up at the end.
"""

import argparse
import sys
from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.telemetry import TELEMETRY_PARTITIONS
from market_pipeline.config import LoopConfig, load_config

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
control_loop_schedule = control_loop_schedule_for(load_config().loop)


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
    hour = start
    while hour < end:
        key = hour.strftime("%Y-%m-%d-%H:%M")
        _check(telemetry_job.execute_in_process(partition_key=key, instance=instance), f"telemetry {key}")
        _check(tick_job.execute_in_process(instance=instance), f"control tick after {key}")
        _run_sensor_requests(defs, instance)
        print(f"  simulated {key} UTC", file=sys.stderr)
        hour += timedelta(hours=1)
    billing = defs.resolve_job_def("billing_job")
    last_hour = (end - timedelta(hours=1)).strftime("%Y-%m-%d-%H:%M")
    _check(billing.execute_in_process(instance=instance, tags={
        "dagster/asset_partition_range_start": start.strftime("%Y-%m-%d-%H:%M"),
        "dagster/asset_partition_range_end": last_hour}), "billing rollup")
    return summarise(defs.resources["warehouse"].reader(), fleet.config(), start, end)


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
    args = parser.parse_args(argv)
    instance = dg.DagsterInstance.get()
    summary = run_control_loop(args.days, instance)
    from market_pipeline.loop_summary import render

    print(render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
