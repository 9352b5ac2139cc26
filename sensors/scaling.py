"""scaling_sensor: one run of scaling_actions_job per tick's batch of approved scaling actions.

scaling_plan (asset, decisions kind 'scale') --> scaling_sensor (run_key = batch id
`scale@<tick>`) --RunRequest--> scaling_actions_job (execute_scaling_batch: each action
claimed once in the warehouse, carried out through the adapter, its outcome recorded).
The sensor only reads.
"""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import dagster as dg

from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.action_batches import batch_id_for, parse_tick
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.scaling_live import SCALE_KIND, execute_scaling_batch, pending_scaling_batches
from sensors.batches import ActionBatchConfig, batch_output, run_is_live, sensor_result

SCALING_OP_NAME = "execute_scaling_batch"
TAG_PREFIX = "scaling"
BATCH_TAG = f"{TAG_PREFIX}/batch_id"


@dg.op(name=SCALING_OP_NAME, pool="warehouse", tags={"concern": "scaling"})
def execute_scaling_batch_op(context: dg.OpExecutionContext, config: ActionBatchConfig,
                             fleet: FleetAdapterResource, warehouse: WarehouseResource) -> dg.Output[None]:
    """Power on/off, cordon or uncordon nodes for one tick's approved scaling decisions."""
    try:
        tick = parse_tick(config.tick)
    except ValueError as exc:
        raise dg.Failure(description=str(exc)) from None
    adapter = fleet.get()
    results = execute_scaling_batch(warehouse.get(), adapter, tick, run_id=context.run_id,
                                    now=adapter_now(adapter), run_is_live=run_is_live(context.instance))
    return batch_output(context, "scaling batch", batch_id_for(SCALE_KIND, tick), results)


@dg.job(name="scaling_actions_job", tags={"concern": "scaling"})
def scaling_actions_job() -> None:
    execute_scaling_batch_op()


@dg.sensor(job=scaling_actions_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def scaling_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
    """One run per tick with approved, live, not yet executed scaling actions."""
    return sensor_result(context, lambda: pending_scaling_batches(warehouse.reader()), prefix=TAG_PREFIX,
                         op_name=SCALING_OP_NAME, what="scaling", given_up_hint="the next plan re-decides")
