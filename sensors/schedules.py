"""The control loop's schedules, on the fleet's time.

Schedules start stopped, so `make ui` only looks; `make up` (live) declares them running
(LIVE_ENV=1), and the simulated daemon (`make demo`, `bench soak`) starts the ones it drives.
Every run a schedule asks for carries TICK_TAG, the (simulated or wall) moment it serves:
the schedule's execution time. The daemon on the simulated clock (sensors/sim_daemon.py)
and the live daemon (`make up`) evaluate the same schedules, so a run's tick tag, its
partition and the twin's clock agree. Hourly partitioned jobs ask for the hour that has
just closed.

The schedules whose cron follows the config (the control tick, the demand-response refit)
are built by `loop_schedules(config)` when the definitions are composed, not at import.
"""

import datetime as dt
import os
from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.partitions import HOURLY_PARTITIONS
from assets.tags import TICK_TAG, tick_tags
from market_pipeline.billing.metering import HourWindow
from market_pipeline.config import DemandResponseConfig, LoopConfig, MarketPipelineConfig
from market_pipeline.telemetry.partitions import PARTITION_FORMAT
from sensors.jobs import billing_job, control_loop_job, demand_response_job, metering_job, telemetry_job

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


def hourly_schedules() -> list[dg.ScheduleDefinition]:
    """Telemetry and metering of the hour that closed leave the queue before the tick at the
    top of the hour (priority 1), so the tick's demand history holds that hour; billing
    follows at a quarter past."""
    first = HOURLY_PARTITIONS.start
    return [
        hourly_partition_schedule(
            telemetry_job,
            "telemetry_hourly",
            0,
            "Ingest and check the hour that just closed.",
            first_hour=first,
            priority=1,
        ),
        hourly_partition_schedule(
            metering_job,
            "metering_hourly",
            0,
            "Meter the hour that just closed "
            "(usage_intervals), for the control ticks' demand history and for billing.",
            first_hour=first,
            priority=1,
        ),
        hourly_partition_schedule(
            billing_job, "billing_hourly_schedule", 15, "Bill the hour that just closed.", first_hour=first
        ),
    ]


def control_loop_schedule_for(loop: LoopConfig) -> dg.ScheduleDefinition:
    """Every loop.tick_minutes (the scaling policy and the backlog certificate are sized for
    that interval; the config rejects a tick that does not divide the hour)."""
    return tick_schedule(
        "control_loop_tick",
        control_loop_job,
        loop.tick_cron,
        f"Reprice, plan scaling and request drains every {loop.tick_minutes} minutes (loop.tick_minutes).",
    )


def demand_response_schedule_for(settings: DemandResponseConfig) -> dg.ScheduleDefinition:
    return tick_schedule(
        "demand_response_refit",
        demand_response_job,
        f"0 */{settings.refit_hours} * * *",
        f"Refit the demand response every {settings.refit_hours} h (demand_response.refit_hours).",
    )


def billing_range_tags(start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """Tags for one billing_job run over the hourly partitions in [start, end), e.g.
    `billing_job.execute_in_process(instance=..., tags=billing_range_tags(start, end))`."""
    first = HourWindow.containing(start).start
    last = HourWindow.containing(end - dt.timedelta(microseconds=1)).start
    if last < first:
        raise ValueError(f"billing range [{start.isoformat()}, {end.isoformat()}) holds no hour")
    return {
        "dagster/asset_partition_range_start": first.strftime(PARTITION_FORMAT),
        "dagster/asset_partition_range_end": last.strftime(PARTITION_FORMAT),
    }


def daily_rerun_request(when: dt.datetime) -> dg.RunRequest:
    """A ranged run over the 24 hourly partitions of the UTC day before `when`."""
    day = when.astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    first = day - dt.timedelta(days=1)
    return dg.RunRequest(run_key=f"billing-day-{first:%Y-%m-%d}", tags=billing_range_tags(first, day))


def billing_daily_schedule() -> dg.ScheduleDefinition:
    """Close yesterday: one ranged run over its 24 hours, tagged with the tick it serves."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        request = daily_rerun_request(context.scheduled_execution_time)
        return request.with_replaced_attrs(
            tags={**request.tags, **tick_tags(context.scheduled_execution_time)}
        )

    return dg.ScheduleDefinition(
        name="billing_daily_schedule",
        job=billing_job,
        cron_schedule="40 0 * * *",
        execution_fn=evaluate,
        execution_timezone="UTC",
        default_status=default_status(),
        description="Close yesterday: re-bill its 24 hours in one run.",
    )


def loop_schedules(config: MarketPipelineConfig) -> list[dg.ScheduleDefinition]:
    """Every schedule of the loop, the configured ones built from `config`."""
    return [
        *hourly_schedules(),
        control_loop_schedule_for(config.loop),
        billing_daily_schedule(),
        demand_response_schedule_for(config.demand_response),
    ]
