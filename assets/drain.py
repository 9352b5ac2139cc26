"""Task drains (node level): plan `drain_requests`; `drain_job` carries a tick's batch out.

drain_requests (asset) --decisions--> drain_sensor (sensors/drain.py, run_key = batch id
`drain@<tick>`) --RunRequest--> drain_job (execute_drain_batch: each drain claimed once,
then the persisted drain protocol via the adapter).
"""

from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.metadata import ROW_COUNT, table_metadata
from assets.resources import FleetAdapterResource, WarehouseResource
from assets.scaling import scaling_plan
from market_pipeline.action_batches import batch_id_for, parse_tick
from market_pipeline.guardrails.task_drain_batches import DRAIN_KIND, execute_drain_batch
from market_pipeline.guardrails.task_drain_service import (
    decision_rows,
    outcome_summary,
    plan_and_record,
)
from market_pipeline.guardrails.task_drain_store import recent_drain_outcomes
from market_pipeline.hardware.protocol import adapter_now
from sensors.batches import ActionBatchConfig, batch_output, run_is_live

DRAIN_OP_NAME = "execute_drain_batch"


# telemetry_samples: the planner reads the recent clean samples (telemetry_clean) it writes
@dg.asset(group_name="drain", pool="warehouse", deps=[scaling_plan, dg.AssetKey("telemetry_samples")],
          kinds={"duckdb"})
def drain_requests(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Drain decisions of this tick (table `decisions`, kind 'drain'): approved or blocked, with reasons."""
    config = fleet.config()
    store = warehouse.get()
    now = datetime.now(timezone.utc)
    adapter = fleet.get()
    # Nodes the scaler cordoned for removal get their tasks drained (reason scale_down).
    cordoned = [n.node_id for n in adapter.list_nodes() if n.cordoned]
    decisions, written, source = plan_and_record(store, adapter, config, wall_now=now,
                                                 scale_down_nodes=cordoned)
    approved = [d for d in decisions if d.allowed]
    by_trigger: dict[str, int] = {}
    for d in decisions:
        by_trigger[d.reason.value] = by_trigger.get(d.reason.value, 0) + 1
    recent = outcome_summary(recent_drain_outcomes(store, now - timedelta(hours=24)))
    context.log.info("drain decisions: %d (%d approved, %d new rows), samples from %s",
                     len(decisions), len(approved), written, source)
    return dg.MaterializeResult(metadata={
        ROW_COUNT: written,
        "decisions": len(decisions),
        "approved": len(approved),
        "blocked": len(decisions) - len(approved),
        "new_rows": written,
        "shadow": bool(config.loop.shadow_mode),
        "samples_from": source,
        "by_trigger": dg.MetadataValue.json(by_trigger),
        "decision_table": table_metadata(decision_rows(decisions)),
        "outcomes_24h": dg.MetadataValue.json(recent),
    })


@dg.op(name=DRAIN_OP_NAME, pool="warehouse", tags={"concern": "task_drain"})
def execute_drain_batch_op(
    context: dg.OpExecutionContext, config: ActionBatchConfig,
    fleet: FleetAdapterResource, warehouse: WarehouseResource,
) -> dg.Output[None]:
    """Run (or resume) the drain protocol for each approved drain of one tick, once each."""
    try:
        tick = parse_tick(config.tick)
    except ValueError as exc:
        raise dg.Failure(description=str(exc)) from None
    adapter = fleet.get()
    results = execute_drain_batch(warehouse.get(), adapter, fleet.config(), tick, run_id=context.run_id,
                                  now=adapter_now(adapter), run_is_live=run_is_live(context.instance))
    # A failed drain is recorded and terminal: a rerun reports it without touching the task.
    return batch_output(context, "drain batch", batch_id_for(DRAIN_KIND, tick), results)


@dg.job(name="drain_job", tags={"concern": "task_drain"})
def drain_job() -> None:
    execute_drain_batch_op()


def drain_run_config(tick: datetime) -> dg.RunConfig:
    """The run config of one tick's drain batch (the sensor's, or an operator's rerun)."""
    return dg.RunConfig(ops={DRAIN_OP_NAME: ActionBatchConfig(tick=tick.isoformat())})


drain_assets = [drain_requests]
