"""The demand-response refit schedule, its period from the config."""

import dagster as dg

from assets.demand_response.jobs import demand_response_job
from assets.lib.schedules import tick_schedule
from market_pipeline.config import DemandResponseConfig


def demand_response_schedule_for(settings: DemandResponseConfig) -> dg.ScheduleDefinition:
    return tick_schedule(
        "demand_response_refit",
        demand_response_job,
        f"0 */{settings.refit_hours} * * *",
        f"Refit the demand response every {settings.refit_hours} h (demand_response.refit_hours).",
    )
