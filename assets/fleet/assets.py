"""Fleet inventory: what the node hardware adapter reports, as warehouse tables."""

from datetime import datetime

import dagster as dg

from assets.lib.metadata import ROW_COUNT, table_metadata
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.lib.tags import TICK_TAG
from market_pipeline.fleet.demand import pool_snapshot
from market_pipeline.fleet.inventory import gpus_frame, nodes_frame, tasks_frame, unpriced_nodes
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.warehouse.writers import write_fleet_inventory

# The nodes themselves, read through the node hardware adapter: where the lineage begins.
fleet_adapter = dg.AssetSpec(
    "fleet_adapter",
    group_name="fleet",
    kinds={"python"},
    description="The node hardware adapter (adapter.backend in the config): nodes, GPUs, tasks, "
    "telemetry samples and task lifecycle events. External: read, never materialised here.",
)


@dg.asset(group_name="fleet", pool="warehouse", deps=[fleet_adapter], kinds={"duckdb"})
def fleet_inventory(
    context: dg.AssetExecutionContext, fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Nodes, GPUs and running tasks as the adapter sees them now (fleet_nodes, fleet_gpus, tasks)."""
    adapter = fleet.get()
    _follow_the_tick(adapter, context.run.tags.get(TICK_TAG))
    observed_at = adapter_now(adapter)
    nodes = adapter.list_nodes()
    gpus = adapter.list_gpus()
    tasks = adapter.list_tasks()
    # Only backends with a queue (the simulated fleet) can say what waits for capacity.
    pending_summary = getattr(adapter, "pending_summary", None)
    queue = pending_summary() if pending_summary else {}
    snapshot = pool_snapshot(fleet.config(), nodes, tasks, queue, observed_at)
    write_fleet_inventory(
        warehouse.get(),
        observed_at,
        snapshot,
        nodes_frame(nodes, observed_at),
        gpus_frame(gpus, observed_at),
        tasks_frame(tasks, observed_at),
    )
    by_state: dict[str, int] = {}
    for node in nodes:
        by_state[node.state.value] = by_state.get(node.state.value, 0) + 1
    context.log.info("fleet: %d nodes, %d GPUs, %d tasks", len(nodes), len(gpus), len(tasks))
    unpriced = unpriced_nodes(nodes, set(fleet.config().pool_by_id))
    if unpriced:
        context.log.warning("GPUs in pools no configured pool prices: %s", unpriced)
    return dg.MaterializeResult(
        metadata={
            "observed_at": dg.MetadataValue.text(observed_at.isoformat()),
            ROW_COUNT: len(nodes),
            "nodes": len(nodes),
            **{f"nodes_{state}": count for state, count in sorted(by_state.items())},
            "gpus": len(gpus),
            "running_tasks": len(tasks),
            "pools": table_metadata(snapshot),
            "unpriced_gpus": sum(unpriced.values()),
            "unpriced_pools": dg.MetadataValue.json(unpriced),
        }
    )


def _follow_the_tick(adapter, tick: str | None) -> None:
    """A simulated twin moves on to the tick the run serves (a schedule's tag), so the fleet
    lives on Dagster's clock: the simulated daemon's in `make demo`, the wall clock live.
    Real fleets live on the wall clock anyway; a twin already past the tick stays."""
    advance = getattr(adapter, "advance", None)
    if tick and advance is not None:
        advance(datetime.fromisoformat(tick))


fleet_assets = [fleet_adapter, fleet_inventory]
