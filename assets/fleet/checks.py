"""The fleet inventory's check: the rigid guarantee (the shared table is in
assets/lib/verdicts.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
import dagster as dg

from assets.lib.resources import FleetAdapterResource
from assets.lib.verdicts import verdict_result
from market_pipeline.decision_checks.guarantee import rigid_guarantee_verdict


@dg.asset_check(
    asset=dg.AssetKey("fleet_inventory"),
    description="The rigid guarantee: no guaranteed task waits past its SLA wait "
    "(guardrails.task_drain.max_total_seconds) while drainable tasks hold GPUs of its model "
    "(backends with a queue: the simulated fleet).",
)
def rigid_guarantee(fleet: FleetAdapterResource) -> dg.AssetCheckResult:
    config = fleet.config()
    pending_summary = getattr(fleet.get(), "pending_summary", None)
    if pending_summary is None or not config.guardrails.rigid_guarantee.enabled:
        return dg.AssetCheckResult(passed=True, description="no queue to check (or the guarantee is off)")
    verdict = rigid_guarantee_verdict(pending_summary(), config.guardrails.task_drain.max_total_seconds)
    return verdict_result(verdict, severity=dg.AssetCheckSeverity.WARN)


fleet_checks = [rigid_guarantee]
