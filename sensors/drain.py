"""drain_sensor: one run of drain_job per tick's batch of approved, not yet executed drains.

run_key = batch id (`drain@<tick>`), so Dagster launches each batch at most once however
often the sensor ticks; inside, each drain is claimed once and the drain protocol itself is
idempotent per decision as a second guard. A run that died before its drains finished
(process killed, fleet unreachable) would otherwise leave them half-way for ever: after such
a failed run the sensor asks for a resume run (`<batch id>#resume<n>`, at most RESUME_LIMIT),
which continues each drain from its audit log without repeating a step. The sensor only reads.
"""

import dagster as dg

from assets.drain import DRAIN_OP_NAME, drain_job
from assets.resources import WarehouseResource
from market_pipeline.drain_batches import pending_drain_batches
from market_pipeline.warehouse import WarehouseError
from sensors.batches import RESUME_LIMIT, batch_requests

TAG_PREFIX = "drain"
BATCH_TAG = f"{TAG_PREFIX}/batch_id"


@dg.sensor(job=drain_job, minimum_interval_seconds=30,
           default_status=dg.DefaultSensorStatus.RUNNING)
def drain_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
    try:
        pending = pending_drain_batches(warehouse.reader())
    except WarehouseError as exc:
        return dg.SkipReason(f"warehouse not readable: {exc}")
    requests, given_up = batch_requests(context, pending, prefix=TAG_PREFIX, op_name=DRAIN_OP_NAME)
    if given_up:
        context.log.warning("drain batches left to an operator after %d failed runs "
                            "(`market-pipeline drain --decision-id ID`): %s",
                            RESUME_LIMIT + 1, given_up)
    if not requests:
        return dg.SkipReason("no approved drain decision is waiting")
    return requests
