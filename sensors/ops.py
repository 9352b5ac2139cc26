"""The ops of the two batch jobs (sensors/jobs.py): carry one tick's approved drains or
scaling actions out through the adapter, each decision claimed once in the warehouse."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from datetime import datetime

import dagster as dg

from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.action_batches import batch_id_for, parse_tick
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


@dg.op(name=DRAIN_OP_NAME, pool="warehouse", tags={"concern": "task_drain"})
def execute_drain_batch_op(
    context: dg.OpExecutionContext,
    config: ActionBatchConfig,
    fleet: FleetAdapterResource,
    warehouse: WarehouseResource,
) -> dg.Output[None]:
    """Run (or resume) the drain protocol for each approved drain of one tick, once each."""
    tick = _tick(config)
    adapter = fleet.get()
    results = execute_drain_batch(
        warehouse.get(),
        adapter,
        fleet.config(),
        tick,
        run_id=context.run_id,
        now=adapter_now(adapter),
        run_is_live=run_is_live(context.instance),
    )
    # A failed drain is recorded and terminal: a rerun reports it without touching the task.
    return batch_output(context, "drain batch", batch_id_for(DRAIN_KIND, tick), results)


@dg.op(name=SCALING_OP_NAME, pool="warehouse", tags={"concern": "scaling"})
def execute_scaling_batch_op(
    context: dg.OpExecutionContext,
    config: ActionBatchConfig,
    fleet: FleetAdapterResource,
    warehouse: WarehouseResource,
) -> dg.Output[None]:
    """Power on/off, cordon or uncordon nodes for one tick's approved scaling decisions."""
    tick = _tick(config)
    adapter = fleet.get()
    results = execute_scaling_batch(
        warehouse.get(),
        adapter,
        tick,
        run_id=context.run_id,
        now=adapter_now(adapter),
        run_is_live=run_is_live(context.instance),
    )
    return batch_output(context, "scaling batch", batch_id_for(SCALE_KIND, tick), results)


def drain_run_config(tick: datetime) -> dg.RunConfig:
    """The run config of one tick's drain batch (the sensor's, or an operator's rerun)."""
    return dg.RunConfig(ops={DRAIN_OP_NAME: ActionBatchConfig(tick=tick.isoformat())})
