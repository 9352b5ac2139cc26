"""The control loop's tick schedule, its cron from the config."""

import dagster as dg

from assets.lib.schedules import tick_schedule
from assets.market.jobs import control_loop_job
from market_pipeline.config import LoopConfig


def control_loop_schedule_for(loop: LoopConfig) -> dg.ScheduleDefinition:
    """Every loop.tick_minutes (the scaling policy and the backlog certificate are sized for
    that interval; the config rejects a tick that does not divide the hour)."""
    return tick_schedule(
        "control_loop_tick",
        control_loop_job,
        loop.tick_cron,
        f"Reprice, plan scaling and request drains every {loop.tick_minutes} minutes (loop.tick_minutes).",
    )
