"""Task drains (node level): plan `drain_requests`; `drain_job` carries one decision out.

drain_requests (asset) --decisions--> drain_sensor (sensors/drain.py, run_key = decision id)
--RunRequest--> drain_job (execute_drain op: the persisted drain protocol via the adapter).
"""

from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.resources import FleetAdapterResource, WarehouseResource
from assets.scaling import scaling_plan
from market_pipeline.guardrails.task_drain_service import (
    decisions_markdown,
    execute_decision,
    outcome_summary,
    plan_and_record,
)
from market_pipeline.guardrails.task_drain_store import recent_drain_outcomes

DRAIN_OP_NAME = "execute_drain"


@dg.asset(group_name="drain", pool="warehouse", deps=[scaling_plan], kinds={"duckdb"})
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
        "decisions": len(decisions),
        "approved": len(approved),
        "blocked": len(decisions) - len(approved),
        "new_rows": written,
        "shadow": bool(config.loop.shadow_mode),
        "samples_from": source,
        "by_trigger": dg.MetadataValue.json(by_trigger),
        "decision_table": dg.MetadataValue.md(decisions_markdown(decisions)),
        "outcomes_24h": dg.MetadataValue.json(recent),
    })


class DrainDecisionConfig(dg.Config):
    decision_id: str


@dg.op(name=DRAIN_OP_NAME, pool="warehouse", tags={"concern": "task_drain"})
def execute_drain(
    context: dg.OpExecutionContext, config: DrainDecisionConfig,
    fleet: FleetAdapterResource, warehouse: WarehouseResource,
) -> dg.Output[None]:
    """Run (or resume) the drain protocol for one approved decision."""
    report = execute_decision(warehouse.get(), fleet.get(), fleet.config(), config.decision_id)
    metadata = {
        "decision_id": report.decision_id or config.decision_id,
        "task_id": report.task_id or "",
        "outcome": report.outcome,
        "seconds": round(report.seconds, 3),
        "states": " -> ".join(report.states),
        "checkpoint": report.checkpoint or "",
        "platform_fault": report.platform_fault,
        "reason": report.reason,
    }
    context.log.info("drain %s: %s", config.decision_id, metadata)
    if report.outcome == "failed":
        # Recorded and terminal: a rerun returns this report without touching the task.
        raise dg.Failure(description=f"drain {config.decision_id} failed: {report.reason}",
                         metadata=metadata)
    return dg.Output(None, metadata=metadata)


@dg.job(name="drain_job", tags={"concern": "task_drain"})
def drain_job() -> None:
    execute_drain()


def drain_run_config(decision_id: str) -> dg.RunConfig:
    return dg.RunConfig(ops={DRAIN_OP_NAME: DrainDecisionConfig(decision_id=decision_id)})


drain_assets = [drain_requests]
