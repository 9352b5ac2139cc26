"""The composition root: every asset, check, job, schedule, sensor and resource of the
control loop, loaded by workspace.yaml. The only module that composes `dg.Definitions`; it
composes them stage by stage (`assets/<stage>/{assets,checks,jobs,schedules}.py`), with this
package's sensors. It lives in sensors/, the top layer, because it imports both layers; nothing
imports it (an import-linter contract), tests aside.

Importing it composes them: the config is read and the dbt project prepared here, once,
not when the asset, job or schedule modules are imported.
"""

import os
import warnings

import dagster as dg

# Startup stays quiet: these two notices say a parameter the project relies on is still beta
# in Dagster 1.13 (single-run backfills of the billing assets; sensor `owners`, which Dagster
# itself passes when it binds resources); nothing an operator can act on. Set before the
# asset modules load, where the first is raised.
warnings.filterwarnings(
    "ignore", message="Parameter `backfill_policy` of function `asset`", category=dg.BetaWarning
)
warnings.filterwarnings(
    "ignore", message="Parameter `owners` of initializer `SensorDefinition", category=dg.BetaWarning
)

from assets.billing.assets import billing_assets  # noqa: E402 - after the filters above
from assets.billing.dbt import billing_dbt_models, billing_dbt_pool, dbt_resource  # noqa: E402
from assets.billing.jobs import billing_job  # noqa: E402
from assets.billing.schedules import billing_daily_schedule, billing_hourly_schedule  # noqa: E402
from assets.demand_response.assets import demand_response_assets  # noqa: E402
from assets.demand_response.jobs import demand_response_job  # noqa: E402
from assets.demand_response.schedules import demand_response_schedule_for  # noqa: E402
from assets.drains.assets import drain_assets  # noqa: E402
from assets.drains.checks import drain_checks  # noqa: E402
from assets.drains.jobs import drain_job  # noqa: E402
from assets.fleet.assets import fleet_assets  # noqa: E402
from assets.fleet.checks import fleet_checks  # noqa: E402
from assets.lib.resources import FleetAdapterResource, WarehouseResource  # noqa: E402
from assets.market.assets import market_assets  # noqa: E402
from assets.market.checks import market_checks  # noqa: E402
from assets.market.jobs import control_loop_job  # noqa: E402
from assets.market.schedules import control_loop_schedule_for  # noqa: E402
from assets.metering.assets import metering_assets  # noqa: E402
from assets.metering.jobs import metering_job  # noqa: E402
from assets.metering.schedules import metering_hourly_schedule  # noqa: E402
from assets.scaling.assets import scaling_assets  # noqa: E402
from assets.scaling.checks import scaling_plan_checks  # noqa: E402
from assets.scaling.jobs import scaling_actions_job  # noqa: E402
from assets.simulation.assets import simulation_assets  # noqa: E402
from assets.telemetry.assets import telemetry_assets  # noqa: E402
from assets.telemetry.checks import telemetry_checks  # noqa: E402
from assets.telemetry.jobs import telemetry_job  # noqa: E402
from assets.telemetry.schedules import telemetry_hourly_schedule  # noqa: E402
from market_pipeline.config import CONFIG_ENV, MarketPipelineConfig, load_config  # noqa: E402
from sensors.drain import drain_sensor  # noqa: E402
from sensors.scaling import scaling_sensor  # noqa: E402

# Every job of the control loop, stage by stage (asset jobs select by key or group).
loop_jobs = [
    telemetry_job,
    metering_job,
    control_loop_job,
    billing_job,
    demand_response_job,
    drain_job,
    scaling_actions_job,
]

# The decision checks, each beside its stage's assets (the table: assets/lib/verdicts.py).
decision_checks = [*market_checks, *scaling_plan_checks, *drain_checks, *fleet_checks]


def loop_schedules(config: MarketPipelineConfig) -> list[dg.ScheduleDefinition]:
    """Every schedule of the loop, the configured ones built from `config`."""
    return [
        telemetry_hourly_schedule(),
        metering_hourly_schedule(),
        billing_hourly_schedule(),
        control_loop_schedule_for(config.loop),
        billing_daily_schedule(),
        demand_response_schedule_for(config.demand_response),
    ]


def executor_for(config: MarketPipelineConfig) -> dg.ExecutorDefinition:
    """The embedded default runs a run's steps in its one process: they queue on the
    `warehouse` pool anyway, and a process per step would load the solver and the twin again
    for each. The cluster profile (`orchestration.executor = "celery"`) sends each step to a
    Celery worker (dagster-celery); the broker is the executor's config, what a run's
    `execution: config:` would carry."""
    if config.orchestration.executor == "in_process":
        return dg.in_process_executor
    from dagster_celery import celery_executor

    return celery_executor.configured(config.orchestration.celery_executor_config())


def build_definitions() -> dg.Definitions:
    """The code location from the configured loop (MARKET_PIPELINE_CONFIG or the shipped one):
    a config that does not load, or a fleet whose GPU models nobody priced, stops it here."""
    config_path = os.environ.get(CONFIG_ENV, "")
    config = load_config(config_path or None)
    return dg.Definitions(
        assets=[
            *fleet_assets,
            *telemetry_assets,
            *metering_assets,
            *market_assets,
            *scaling_assets,
            *drain_assets,
            *billing_assets,
            billing_dbt_models(billing_dbt_pool(config)),
            *simulation_assets,
            *demand_response_assets,
        ],
        asset_checks=[*telemetry_checks, *decision_checks],
        jobs=loop_jobs,
        schedules=loop_schedules(config),
        sensors=[drain_sensor, scaling_sensor],
        resources={
            "warehouse": WarehouseResource.from_config(config),
            "fleet": FleetAdapterResource(config_path=config_path),
            "dbt": dbt_resource(),
        },
        executor=executor_for(config),
    )


defs = build_definitions()
