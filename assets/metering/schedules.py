"""The metering schedule: the hour that just closed, before the tick at the top of the hour."""

import dagster as dg

from assets.lib.partitions import HOURLY_PARTITIONS
from assets.lib.schedules import hourly_partition_schedule
from assets.metering.jobs import metering_job


def metering_hourly_schedule() -> dg.ScheduleDefinition:
    return hourly_partition_schedule(
        metering_job,
        "metering_hourly",
        0,
        "Meter the hour that just closed "
        "(usage_intervals), for the control ticks' demand history and for billing.",
        first_hour=HOURLY_PARTITIONS.start,
        priority=1,
    )
