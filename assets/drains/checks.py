"""The drain requests' check (the shared table is in assets/lib/verdicts.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import dagster as dg

from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.lib.verdicts import verdict_result
from market_pipeline.decision_checks.drains import approved_drains, drain_limits_verdict
from market_pipeline.drain.limits import DrainLimits
from market_pipeline.warehouse.readers import pool_nodes_on

DRAIN_REQUESTS = dg.AssetKey("drain_requests")


@dg.asset_check(
    asset=DRAIN_REQUESTS,
    blocking=True,
    description="Approved drains within their limits: per tenant at most "
    "guardrails.task_drain.tenant_max_drains_per_day in 24 h, per pool the open "
    "drains within the disruption budget.",
)
def drain_requests_within_limits(
    fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    store = warehouse.reader()
    drains, now = approved_drains(store)
    limits = DrainLimits.from_config(fleet.config())
    return verdict_result(drain_limits_verdict(drains, now, limits, pool_nodes_on(store)))


drain_checks = [drain_requests_within_limits]
