"""The ops of the two batch jobs (sensors/jobs.py): carry one tick's approved drains or
scaling actions out through the adapter, each decision claimed once in the warehouse."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import dagster as dg

from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.action_batches import ActionResult, batch_id_for, parse_tick
from market_pipeline.drain.batches import DRAIN_KIND, execute_drain_batch
from market_pipeline.hardware.protocol import NodeAdapter, adapter_now
from market_pipeline.scaling.live import SCALE_KIND, execute_scaling_batch
from market_pipeline.warehouse.store import Warehouse
from sensors.batches import ActionBatchConfig, batch_output, run_is_live

DRAIN_OP_NAME = "execute_drain_batch"
SCALING_OP_NAME = "execute_scaling_batch"


def _tick(config: ActionBatchConfig) -> datetime:
    try:
        return parse_tick(config.tick)
    except ValueError as exc:
        raise dg.Failure(description=str(exc)) from None


class _CarryOut(Protocol):
    """Carries one tick's approved actions of a kind out, each once, and says how each went."""

    def __call__(
        self,
        fleet: FleetAdapterResource,
        store: Warehouse,
        adapter: NodeAdapter,
        tick: datetime,
        *,
        run_id: str,
        now: datetime,
        run_is_live: Callable[[str], bool],
    ) -> list[ActionResult]: ...


def _batch_op(
    name: str, concern: str, kind: str, what: str, carry_out: _CarryOut, description: str
) -> dg.OpDefinition:
    """The op that carries out one tick's batch of `kind` (claimed once in the warehouse); the
    run fails, after every action is recorded, only when an action failed."""

    @dg.op(name=name, pool="warehouse", tags={"concern": concern}, description=description)
    def batch_op(
        context: dg.OpExecutionContext,
        config: ActionBatchConfig,
        fleet: FleetAdapterResource,
        warehouse: WarehouseResource,
    ) -> dg.Output[None]:
        tick = _tick(config)
        adapter = fleet.get()
        results = carry_out(
            fleet,
            warehouse.get(),
            adapter,
            tick,
            run_id=context.run_id,
            now=adapter_now(adapter),
            run_is_live=run_is_live(context.instance),
        )
        return batch_output(context, what, batch_id_for(kind, tick), results)

    return batch_op


def _drains(
    fleet: FleetAdapterResource, store: Warehouse, adapter: NodeAdapter, tick: datetime, **run
) -> list[ActionResult]:
    # A failed drain is recorded and terminal: a rerun reports it without touching the task.
    return execute_drain_batch(store, adapter, fleet.config(), tick, **run)


def _scaling(
    fleet: FleetAdapterResource, store: Warehouse, adapter: NodeAdapter, tick: datetime, **run
) -> list[ActionResult]:
    return execute_scaling_batch(store, adapter, tick, **run)


execute_drain_batch_op = _batch_op(
    DRAIN_OP_NAME,
    "task_drain",
    DRAIN_KIND,
    "drain batch",
    _drains,
    "Run (or resume) the drain protocol for each approved drain of one tick, once each.",
)
execute_scaling_batch_op = _batch_op(
    SCALING_OP_NAME,
    "scaling",
    SCALE_KIND,
    "scaling batch",
    _scaling,
    "Power on/off, cordon or uncordon nodes for one tick's approved scaling decisions.",
)


def drain_run_config(tick: datetime) -> dg.RunConfig:
    """The run config of one tick's drain batch (the sensor's, or an operator's rerun)."""
    return dg.RunConfig(ops={DRAIN_OP_NAME: ActionBatchConfig(tick=tick.isoformat())})
