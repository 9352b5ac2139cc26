"""Billing's schedules: the hour that just closed (a quarter past), and yesterday closed in
one ranged run."""

import datetime as dt

import dagster as dg

from assets.billing.jobs import billing_job
from assets.lib.partitions import HOURLY_PARTITIONS
from assets.lib.schedules import default_status, hourly_partition_schedule
from assets.lib.tags import tick_tags
from market_pipeline.billing.metering import HourWindow
from market_pipeline.telemetry.partitions import PARTITION_FORMAT


def billing_hourly_schedule() -> dg.ScheduleDefinition:
    return hourly_partition_schedule(
        billing_job,
        "billing_hourly_schedule",
        15,
        "Bill the hour that just closed.",
        first_hour=HOURLY_PARTITIONS.start,
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
