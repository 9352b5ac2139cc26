"""The ops of the two batch jobs (sensors/jobs.py): carry one tick's approved drains or
scaling actions out through the adapter, each decision claimed once in the warehouse."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from collections.abc import Callable
from datetime import datetime
from functools import partial

import dagster as dg

from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.action_batches import ActionResult, batch_id_for, parse_tick
from market_pipeline.drain.batches import DRAIN_KIND, execute_drain_batch
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.scaling.live import SCALE_KIND, execute_scaling_batch
from sensors.batches import ActionBatchConfig, batch_output, run_is_live

DRAIN_OP_NAME = "execute_drain_batch"
SCALING_OP_NAME = "execute_scaling_batch"


def _tick(config: ActionBatchConfig) -> datetime:
    try:
        return parse_tick(config.tick)
    except ValueError as exc:
        raise dg.Failure(description=str(exc)) from None


# A batch's executor: (store, adapter, *, tick, run_id, now, run_is_live) -> one result per action.
BatchExecutor = Callable[..., list[ActionResult]]


def _batch_op(
    name: str,
    concern: str,
    kind: str,
    what: str,
    executor: Callable[[FleetAdapterResource], BatchExecutor],
    description: str,
) -> dg.OpDefinition:
    """The op that carries out one tick's batch of `kind` (each decision claimed once in the
    warehouse) through the executor the fleet resource gives."""

    @dg.op(name=name, pool="warehouse", tags={"concern": concern}, description=description)
    def batch_op(
        context: dg.OpExecutionContext,
        config: ActionBatchConfig,
        fleet: FleetAdapterResource,
        warehouse: WarehouseResource,
    ) -> dg.Output[None]:
        tick = _tick(config)
        adapter = fleet.get()
        results = executor(fleet)(
            warehouse.get(),
            adapter,
            tick=tick,
            run_id=context.run_id,
            now=adapter_now(adapter),
            run_is_live=run_is_live(context.instance),
        )
        return batch_output(context, what, batch_id_for(kind, tick), results)

    return batch_op


# A failed drain is recorded and terminal: a rerun reports it without touching the task.
execute_drain_batch_op = _batch_op(
    DRAIN_OP_NAME,
    "task_drain",
    DRAIN_KIND,
    "drain batch",
    lambda fleet: partial(execute_drain_batch, config=fleet.config()),
    "Run (or resume) the drain protocol for each approved drain of one tick, once each.",
)
execute_scaling_batch_op = _batch_op(
    SCALING_OP_NAME,
    "scaling",
    SCALE_KIND,
    "scaling batch",
    lambda fleet: execute_scaling_batch,
    "Power on/off, cordon or uncordon nodes for one tick's approved scaling decisions.",
)


def drain_run_config(tick: datetime) -> dg.RunConfig:
    """The run config of one tick's drain batch (the sensor's, or an operator's rerun)."""
    return dg.RunConfig(ops={DRAIN_OP_NAME: ActionBatchConfig(tick=tick.isoformat())})
