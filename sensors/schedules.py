"""The control loop's jobs and schedules, on the fleet's time.

Schedules start stopped, so `make ui` only looks; `make up` (live) declares them running
(LIVE_ENV=1), and the simulated daemon (`make demo`, `bench soak`) starts the ones it drives. Every run a schedule asks for carries TICK_TAG, the (simulated or wall) moment it serves:
the schedule's execution time. The daemon on the simulated clock (sensors/sim_daemon.py)
and the live daemon (`make up`) evaluate the same schedules, so a run's tick tag, its
partition and the twin's clock agree. Hourly partitioned jobs ask for the hour that has
just closed.
"""

import os
from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.tags import TICK_TAG, tick_tags  # noqa: F401 - re-exported for the sensors
from assets.telemetry import TELEMETRY_PARTITIONS
from market_pipeline.config import LoopConfig, load_config

LIVE_ENV = "MARKET_PIPELINE_LIVE"  # 1: every schedule is on from the start (`make up`)
PARTITION_FORMAT = "%Y-%m-%d-%H:%M"  # the hourly partitions' key format


def default_status() -> dg.DefaultScheduleStatus:
    live = os.environ.get(LIVE_ENV) == "1"
    return dg.DefaultScheduleStatus.RUNNING if live else dg.DefaultScheduleStatus.STOPPED


def closed_hour_key(moment: datetime) -> str:
    """The partition key of the last hour that closed at or before `moment`."""
    hour = moment.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return (hour - timedelta(hours=1)).strftime(PARTITION_FORMAT)


def hourly_partition_schedule(job, name: str, minute_of_hour: int, description: str, *,
                              first_hour: datetime, priority: int = 0) -> dg.ScheduleDefinition:
    """At minute `minute_of_hour` of every hour: one run of `job` for the hour that closed,
    tagged with the tick it serves (run_key = the partition, so an hour runs once per schedule).
    Hours before `first_hour` (the partitions' start) are skipped. A higher `priority` leaves
    the run queue first when several runs wait (`dagster/priority`)."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        when = context.scheduled_execution_time
        key = closed_hour_key(when)
        if datetime.strptime(key, PARTITION_FORMAT).replace(tzinfo=timezone.utc) < first_hour:
            return dg.SkipReason(f"hour {key} is before the fleet's history ({first_hour.isoformat()})")
        return dg.RunRequest(run_key=key, partition_key=key,
                             tags={**tick_tags(when), "dagster/priority": str(priority)})

    return dg.ScheduleDefinition(name=name, job=job, cron_schedule=f"{minute_of_hour} * * * *",
                                 execution_fn=evaluate, execution_timezone="UTC", description=description,
                                 default_status=default_status())


# One hour of telemetry per partition: samples in, checks on them.
telemetry_job = dg.define_asset_job(
    "telemetry_job",
    selection=dg.AssetSelection.assets("telemetry_samples"),
    description="Ingest and check one hour of per-GPU samples.",
)
# Telemetry and metering of the hour that closed leave the queue before the tick at the top of
# the hour, so the tick's demand history holds that hour.
telemetry_schedule = hourly_partition_schedule(
    telemetry_job, "telemetry_hourly", 0, "Ingest and check the hour that just closed.",
    first_hour=TELEMETRY_PARTITIONS.start, priority=1)

# Metering is its own job: usage_intervals backfills hour ranges in one run
# (BackfillPolicy.single_run) while telemetry_samples takes one hour per run; one job mixing
# both policies makes Dagster warn at every start.
metering_job = dg.define_asset_job(
    "metering_job",
    selection=dg.AssetSelection.assets("usage_intervals"),
    description="Meter one hour of per-second task usage from the adapter's task events.",
)
metering_schedule = hourly_partition_schedule(
    metering_job, "metering_hourly", 0, "Meter the hour that just closed (usage_intervals), for the "
                                        "control ticks' demand history and for billing.",
    first_hour=TELEMETRY_PARTITIONS.start, priority=1)

# The repricing tick: inventory -> demand -> forecast -> prices -> price book -> scaling
# plan -> drain requests. Drains and scaling actions run in their own sensor-launched jobs.
control_loop_job = dg.define_asset_job(
    "control_loop_job",
    selection=dg.AssetSelection.groups("fleet", "market", "scaling", "drain"),
    description="One control-loop tick over the whole fleet.",
)


def tick_schedule(name: str, job, cron_schedule: str, description: str) -> dg.ScheduleDefinition:
    """A schedule whose runs serve its fire time: tagged with it, run_key = it."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        tags = tick_tags(context.scheduled_execution_time)
        return dg.RunRequest(run_key=tags[TICK_TAG], tags=tags)

    return dg.ScheduleDefinition(name=name, job=job, cron_schedule=cron_schedule, execution_fn=evaluate,
                                 execution_timezone="UTC", default_status=default_status(),
                                 description=description)


def control_loop_schedule_for(loop: LoopConfig) -> dg.ScheduleDefinition:
    return tick_schedule("control_loop_tick", control_loop_job, loop.tick_cron,
                         f"Reprice, plan scaling and request drains every {loop.tick_minutes} minutes "
                         "(loop.tick_minutes).")


# The tick follows loop.tick_minutes (the scaling policy and the backlog certificate are
# sized for that interval); the config rejects a tick that does not divide the hour.
# (the loop section only: the fleet's market is resolved, and checked, when a run starts)
control_loop_schedule = control_loop_schedule_for(load_config(resolve_fleet=False).loop)

loop_jobs = [telemetry_job, metering_job, control_loop_job]
loop_schedules = [telemetry_schedule, metering_schedule, control_loop_schedule]
