"""The drain job: one tick's approved drains, carried out by the sensor-launched batch op
(sensors/drain.py asks for one run per batch)."""

from datetime import datetime
from functools import partial

import dagster as dg

from assets.lib.batch_ops import action_batch_op
from assets.lib.batches import ActionBatchConfig
from market_pipeline.drain.batches import DRAIN_KIND, execute_drain_batch

DRAIN_OP_NAME = "execute_drain_batch"

# A failed drain is recorded and terminal: a rerun reports it without touching the task.
execute_drain_batch_op = action_batch_op(
    DRAIN_OP_NAME,
    "task_drain",
    DRAIN_KIND,
    "drain batch",
    lambda fleet: partial(execute_drain_batch, config=fleet.config()),
    "Run (or resume) the drain protocol for each approved drain of one tick, once each.",
)


@dg.job(name="drain_job", tags={"concern": "task_drain"})
def drain_job() -> None:
    execute_drain_batch_op()


def drain_run_config(tick: datetime) -> dg.RunConfig:
    """The run config of one tick's drain batch (the sensor's, or an operator's rerun)."""
    return dg.RunConfig(ops={DRAIN_OP_NAME: ActionBatchConfig(tick=tick.isoformat())})
