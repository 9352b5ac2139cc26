"""drain_sensor: one run of drain_job per tick's batch of approved, not yet executed drains.

run_key = batch id (`drain@<tick>`), so Dagster launches each batch at most once however
often the sensor ticks; inside, each drain is claimed once and the drain protocol itself is
idempotent per decision as a second guard. A run that died before its drains finished
(process killed, fleet unreachable) would otherwise leave them half-way for ever: after such
a failed run the sensor asks for a resume run (`<batch id>#resume<n>`, at most RESUME_LIMIT),
which continues each drain from its audit log without repeating a step. The sensor only reads.
"""

import dagster as dg

from assets.drains.jobs import DRAIN_OP_NAME, drain_job
from assets.lib.batches import sensor_result
from assets.lib.resources import WarehouseResource
from market_pipeline.drain.batches import pending_drain_batches

TAG_PREFIX = "drain"
BATCH_TAG = f"{TAG_PREFIX}/batch_id"


@dg.sensor(job=drain_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def drain_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
    """One run per tick with approved, live, not yet executed drains."""
    return sensor_result(
        context,
        lambda: pending_drain_batches(warehouse.reader()),
        prefix=TAG_PREFIX,
        op_name=DRAIN_OP_NAME,
        what="drain",
        given_up_hint="left to an operator: `market-pipeline drain --decision-id ID`",
    )
