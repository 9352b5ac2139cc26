"""The control loop's schedules, on the fleet's time.

Schedules start stopped, so `make ui` only looks; `make up` (live) declares them running
(LIVE_ENV=1), and the simulated daemon (`make demo`, `bench soak`) starts the ones it drives.
Every run a schedule asks for carries TICK_TAG, the (simulated or wall) moment it serves:
the schedule's execution time. The daemon on the simulated clock (assets/harness/sim_daemon.py)
and the live daemon (`make up`) evaluate the same schedules, so a run's tick tag, its
partition and the twin's clock agree. Hourly partitioned jobs ask for the hour that has
just closed.

This module holds the two builders every stage's schedules.py uses; the schedules whose cron
follows the config (the control tick, the demand-response refit) are built from it when the
definitions are composed (sensors/definitions.py), not at import. Hourly partitions: telemetry
and metering of the hour that closed leave the queue before the tick at the top of the hour
(priority 1), so the tick's demand history holds that hour; billing follows at a quarter past.
"""

import os
from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.lib.tags import TICK_TAG, tick_tags
from market_pipeline.telemetry.partitions import PARTITION_FORMAT

LIVE_ENV = "MARKET_PIPELINE_LIVE"  # 1: every schedule is on from the start (`make up`)


def default_status() -> dg.DefaultScheduleStatus:
    live = os.environ.get(LIVE_ENV) == "1"
    return dg.DefaultScheduleStatus.RUNNING if live else dg.DefaultScheduleStatus.STOPPED


def closed_hour_key(moment: datetime) -> str:
    """The partition key of the last hour that closed at or before `moment`."""
    hour = moment.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return (hour - timedelta(hours=1)).strftime(PARTITION_FORMAT)


def hourly_partition_schedule(
    job, name: str, minute_of_hour: int, description: str, *, first_hour: datetime, priority: int = 0
) -> dg.ScheduleDefinition:
    """At minute `minute_of_hour` of every hour: one run of `job` for the hour that closed,
    tagged with the tick it serves (run_key = the partition, so an hour runs once per schedule).
    Hours before `first_hour` (the partitions' start) are skipped. A higher `priority` leaves
    the run queue first when several runs wait (`dagster/priority`)."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        when = context.scheduled_execution_time
        key = closed_hour_key(when)
        if datetime.strptime(key, PARTITION_FORMAT).replace(tzinfo=timezone.utc) < first_hour:
            return dg.SkipReason(f"hour {key} is before the fleet's history ({first_hour.isoformat()})")
        return dg.RunRequest(
            run_key=key, partition_key=key, tags={**tick_tags(when), "dagster/priority": str(priority)}
        )

    return dg.ScheduleDefinition(
        name=name,
        job=job,
        cron_schedule=f"{minute_of_hour} * * * *",
        execution_fn=evaluate,
        execution_timezone="UTC",
        description=description,
        default_status=default_status(),
    )


def tick_schedule(name: str, job, cron_schedule: str, description: str) -> dg.ScheduleDefinition:
    """A schedule whose runs serve its fire time: tagged with it, run_key = it."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        tags = tick_tags(context.scheduled_execution_time)
        return dg.RunRequest(run_key=tags[TICK_TAG], tags=tags)

    return dg.ScheduleDefinition(
        name=name,
        job=job,
        cron_schedule=cron_schedule,
        execution_fn=evaluate,
        execution_timezone="UTC",
        default_status=default_status(),
        description=description,
    )
