"""The telemetry schedule: the hour that just closed, before the tick at the top of the hour."""

import dagster as dg

from assets.lib.partitions import HOURLY_PARTITIONS
from assets.lib.schedules import hourly_partition_schedule
from assets.telemetry.jobs import telemetry_job


def telemetry_hourly_schedule() -> dg.ScheduleDefinition:
    return hourly_partition_schedule(
        telemetry_job,
        "telemetry_hourly",
        0,
        "Ingest and check the hour that just closed.",
        first_hour=HOURLY_PARTITIONS.start,
        priority=1,
    )
