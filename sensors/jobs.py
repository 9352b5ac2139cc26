"""Every job of the control loop. Asset jobs select their assets by key or group (no asset
module is imported for it); the two batch jobs run the ops of sensors/ops.py."""

import dagster as dg

from sensors.ops import execute_drain_batch_op, execute_scaling_batch_op

# One hour of telemetry per partition: samples in, checks on them.
telemetry_job = dg.define_asset_job(
    "telemetry_job",
    selection=dg.AssetSelection.assets("telemetry_samples"),
    description="Ingest and check one hour of per-GPU samples.",
)

# Metering is its own job: usage_intervals backfills hour ranges in one run
# (BackfillPolicy.single_run) while telemetry_samples takes one hour per run; one job mixing
# both policies makes Dagster warn at every start.
metering_job = dg.define_asset_job(
    "metering_job",
    selection=dg.AssetSelection.assets("usage_intervals"),
    description="Meter one hour of per-second task usage from the adapter's task events.",
)

# The repricing tick: inventory -> demand -> forecast -> prices -> price book -> scaling
# plan -> drain requests. Drains and scaling actions run in their own sensor-launched jobs.
control_loop_job = dg.define_asset_job(
    "control_loop_job",
    selection=dg.AssetSelection.groups("fleet", "market", "scaling", "drain"),
    description="One control-loop tick over the whole fleet.",
)

billing_job = dg.define_asset_job(
    "billing_job",
    selection=dg.AssetSelection.groups("billing"),
    description="Meter, rate (dbt build with tests), post balances and evaluate budget guards.",
)

# Its own job: the control tick does not refit the demand response every tick.
demand_response_job = dg.define_asset_job(
    "demand_response_job", selection=dg.AssetSelection.assets("demand_response")
)


@dg.job(name="drain_job", tags={"concern": "task_drain"})
def drain_job() -> None:
    execute_drain_batch_op()


@dg.job(name="scaling_actions_job", tags={"concern": "scaling"})
def scaling_actions_job() -> None:
    execute_scaling_batch_op()


loop_jobs = [
    telemetry_job,
    metering_job,
    control_loop_job,
    billing_job,
    demand_response_job,
    drain_job,
    scaling_actions_job,
]
