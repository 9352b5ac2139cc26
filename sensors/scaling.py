"""scaling_sensor: one run of scaling_actions_job per tick's batch of approved scaling actions.

scaling_plan (asset, decisions kind 'scale') --> scaling_sensor (run_key = batch id
`scale@<tick>`) --RunRequest--> scaling_actions_job (assets/scaling/jobs.py; its op claims each
action once in the warehouse, carries it out through the adapter, records its outcome).
The sensor only reads.
"""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import dagster as dg

from assets.lib.batches import sensor_result
from assets.lib.resources import WarehouseResource
from assets.scaling.jobs import SCALING_OP_NAME, scaling_actions_job
from market_pipeline.scaling.live import pending_scaling_batches

TAG_PREFIX = "scaling"
BATCH_TAG = f"{TAG_PREFIX}/batch_id"


@dg.sensor(
    job=scaling_actions_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING
)
def scaling_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
    """One run per tick with approved, live, not yet executed scaling actions."""
    return sensor_result(
        context,
        lambda: pending_scaling_batches(warehouse.reader()),
        prefix=TAG_PREFIX,
        op_name=SCALING_OP_NAME,
        what="scaling",
        given_up_hint="the next plan re-decides",
    )
