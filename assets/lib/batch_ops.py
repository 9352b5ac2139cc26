"""The op factory of the two batch jobs (drains/jobs.py, scaling/jobs.py): an op carries one
tick's approved drains or scaling actions out through the adapter, each decision claimed once
in the warehouse."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from collections.abc import Callable
from datetime import datetime

import dagster as dg

from assets.lib.batches import ActionBatchConfig, batch_output, run_is_live
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.action_batches import ActionResult, batch_id_for, parse_tick
from market_pipeline.hardware.protocol import adapter_now


def _tick(config: ActionBatchConfig) -> datetime:
    try:
        return parse_tick(config.tick)
    except ValueError as exc:
        raise dg.Failure(description=str(exc)) from None


# A batch's executor: (store, adapter, *, tick, run_id, now, run_is_live) -> one result per action.
BatchExecutor = Callable[..., list[ActionResult]]


def action_batch_op(
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
