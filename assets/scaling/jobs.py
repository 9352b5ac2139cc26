"""The scaling actions job: one tick's approved scaling decisions, carried out by the
sensor-launched batch op (sensors/scaling.py asks for one run per batch)."""

import dagster as dg

from assets.lib.batch_ops import action_batch_op
from market_pipeline.scaling.live import SCALE_KIND, execute_scaling_batch

SCALING_OP_NAME = "execute_scaling_batch"

execute_scaling_batch_op = action_batch_op(
    SCALING_OP_NAME,
    "scaling",
    SCALE_KIND,
    "scaling batch",
    lambda fleet: execute_scaling_batch,
    "Power on/off, cordon or uncordon nodes for one tick's approved scaling decisions.",
)


@dg.job(name="scaling_actions_job", tags={"concern": "scaling"})
def scaling_actions_job() -> None:
    execute_scaling_batch_op()
