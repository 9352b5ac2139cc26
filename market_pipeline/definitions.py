"""The composition root: every asset, check, job, schedule, sensor and resource of the
control loop, loaded by workspace.yaml. The only module of the package that imports Dagster."""

import os
import warnings

import dagster as dg

# Startup stays quiet: these two notices say a parameter the project relies on is still beta
# in Dagster 1.13 (single-run backfills of the billing assets; sensor `owners`, which Dagster
# itself passes when it binds resources); nothing an operator can act on. Set before the
# asset modules load, where the first is raised.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy` of function `asset`", category=dg.BetaWarning)
warnings.filterwarnings("ignore", message="Parameter `owners` of initializer `SensorDefinition", category=dg.BetaWarning)

from assets.billing import billing_assets, billing_job, billing_resources, billing_schedules
from assets.decision_checks import decision_checks
from assets.demand_response import demand_response_assets, demand_response_job, demand_response_schedule
from assets.drain import drain_assets, drain_job
from assets.fleet import fleet_assets
from assets.market import market_assets
from assets.resources import FleetAdapterResource, WarehouseResource
from assets.scaling import scaling_assets
from assets.simulation import simulation_assets
from assets.telemetry import telemetry_assets, telemetry_checks
from market_pipeline.config import CONFIG_ENV, load_config
from sensors.drain import drain_sensor
from sensors.schedules import loop_jobs, loop_schedules
from sensors.scaling import scaling_actions_job, scaling_sensor


def _resources() -> dict[str, object]:
    config_path = os.environ.get(CONFIG_ENV, "")
    config = load_config(config_path or None)
    return {
        "warehouse": WarehouseResource(path=str(config.warehouse_path)),
        "fleet": FleetAdapterResource(config_path=config_path),
        **billing_resources,
    }


defs = dg.Definitions(
    assets=[*fleet_assets, *telemetry_assets, *market_assets, *scaling_assets, *drain_assets, *billing_assets,
            *simulation_assets, *demand_response_assets],
    asset_checks=[*telemetry_checks, *decision_checks],
    jobs=[*loop_jobs, drain_job, scaling_actions_job, billing_job, demand_response_job],
    schedules=[*loop_schedules, *billing_schedules, demand_response_schedule],
    sensors=[drain_sensor, scaling_sensor],
    resources=_resources(),
    # A run's steps share one process: they queue on the `warehouse` pool anyway, and a
    # process per step would load the solver and the twin again for each.
    executor=dg.in_process_executor,
)
