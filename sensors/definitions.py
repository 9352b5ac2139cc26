"""The composition root: every asset, check, job, schedule, sensor and resource of the
control loop, loaded by workspace.yaml. The only module that composes `dg.Definitions`.

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

from assets.billing import billing_assets  # noqa: E402 - after the filters above
from assets.billing_dbt import billing_dbt_models, billing_dbt_pool, dbt_resource  # noqa: E402
from assets.decision_checks import decision_checks  # noqa: E402
from assets.demand_response import demand_response_assets  # noqa: E402
from assets.drain import drain_assets  # noqa: E402
from assets.fleet import fleet_assets  # noqa: E402
from assets.market import market_assets  # noqa: E402
from assets.resources import FleetAdapterResource, WarehouseResource  # noqa: E402
from assets.scaling import scaling_assets  # noqa: E402
from assets.simulation import simulation_assets  # noqa: E402
from assets.telemetry import telemetry_assets, telemetry_checks  # noqa: E402
from market_pipeline.config import CONFIG_ENV, MarketPipelineConfig, load_config  # noqa: E402
from sensors.drain import drain_sensor  # noqa: E402
from sensors.jobs import loop_jobs  # noqa: E402
from sensors.scaling import scaling_sensor  # noqa: E402
from sensors.schedules import loop_schedules  # noqa: E402


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
