"""Task drains (node level): plan `drain_requests`.

drain_requests (asset) --decisions--> drain_sensor (sensors/drain.py, run_key = batch id
`drain@<tick>`) --RunRequest--> drain_job (assets/drains/jobs.py; its op claims
each drain once, then runs the persisted drain protocol via the adapter).
"""

from datetime import timedelta

import dagster as dg

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.action_batches import batch_rows
from market_pipeline.drain.queue_rules import close_to_drainable, keep_off_drainable
from market_pipeline.drain.service import decision_rows, outcome_summary, plan_and_record
from market_pipeline.hardware.protocol import DrainableClosure, DrainableKeptOff, adapter_now
from market_pipeline.scaling.live import SCALE_KIND
from market_pipeline.tick.state import tick_origin
from market_pipeline.warehouse.decisions import DecisionAction
from market_pipeline.warehouse.drain_audit import recent_drain_outcomes


# telemetry_samples: the planner reads the recent clean samples (telemetry_clean) it writes
@dg.asset(
    group_name="drain",
    pool="warehouse",
    kinds={"duckdb"},
    deps=[dg.AssetKey("scaling_plan"), dg.AssetKey("telemetry_samples")],
)
def drain_requests(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Drain decisions of this tick (table `decisions`, kind 'drain'): approved or blocked, with reasons."""
    config = fleet.config()
    store = warehouse.get()
    adapter = fleet.get()
    # The tick this plan serves, on the fleet's clock (as the scaling plan's decisions): the
    # batch is `drain@<tick>`, joins to its tick, and its drains age on the clock they run on.
    now = tick_origin(adapter_now(adapter), config.loop.tick_minutes)
    # Nodes the scaler cordoned for removal get their tasks drained (reason scale_down), but
    # not a node this tick's plan takes back (demand returned: its uncordon runs after this
    # asset): its tasks would be drained only to land on it again.
    returning = {r["target"] for r in batch_rows(store, SCALE_KIND, now, (DecisionAction.UNCORDON,))}
    cordoned = [n.node_id for n in adapter.list_nodes() if n.cordoned and n.node_id not in returning]
    # rule 4 of the rigid guarantee where the backend starts work itself (Slurm): no drainable
    # job starts on a GPU model guaranteed work waits on
    closure = close_to_drainable(adapter, config)
    if closure is not None and closure.failed:
        context.log.warning("drainable jobs not deferred: %s", "; ".join(closure.failed))
    # rules 5 and 6 there: the room for the forecast guaranteed arrivals, the empty nodes kept
    # for whole-node guaranteed work and those refilling them take no new drainable work
    kept_off = keep_off_drainable(adapter, config)
    if kept_off is not None and kept_off.refused:
        context.log.warning("no node kept from drainable work: %s", kept_off.refused)
    decisions, written, source = plan_and_record(
        store, adapter, config, wall_now=now, scale_down_nodes=cordoned
    )
    approved = [d for d in decisions if d.allowed]
    by_trigger: dict[str, int] = {}
    for d in decisions:
        by_trigger[d.reason.value] = by_trigger.get(d.reason.value, 0) + 1
    recent = outcome_summary(recent_drain_outcomes(store, now - timedelta(hours=24)))
    context.log.info(
        "drain decisions: %d (%d approved, %d new rows), samples from %s",
        len(decisions),
        len(approved),
        written,
        source,
    )
    return dg.MaterializeResult(
        metadata={
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
            **queue_rules_metadata(closure, kept_off),
        }
    )


def queue_rules_metadata(
    closure: DrainableClosure | None, kept_off: DrainableKeptOff | None
) -> dict[str, object]:
    """What the guarantee's passes did on a backend with a queue of its own (Slurm): rule 4's
    closure, and the nodes rules 5 and 6 keep from drainable work. A backend without one
    (the twin, local processes) ran neither: nothing to add."""
    out: dict[str, object] = {}
    if closure is not None:
        out["closed_to_drainable"] = dg.MetadataValue.json(list(closure.closed_models))
        out["drainable_deferred"] = len(closure.deferred)
        out["drainable_released"] = len(closure.released)
        out["drainable_deferral_failures"] = len(closure.failed)
    if kept_off is not None:
        out["kept_from_drainable"] = dg.MetadataValue.json(list(kept_off.kept))
        out["given_back_to_drainable"] = len(kept_off.returned)
        out["kept_from_drainable_refused"] = kept_off.refused or "-"
    return out


drain_assets = [drain_requests]
