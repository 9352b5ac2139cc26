"""What every decision check shares: a `market_pipeline.decision_checks` verdict as the
Dagster check result. The checks themselves live with their stage (`<stage>/checks.py`); each
wraps a plain function of `market_pipeline.decision_checks` (or the forecast's
`coverage_check`), and a blocking one stops what depends on its asset in the same run, so a
bad decision does not flow on.

| asset | check | blocks | module |
|---|---|---|---|
| equilibrium_prices | solve certified (status, KKT <= tolerance); a fallback warns | yes | market/checks.py |
| equilibrium_prices | negative margins answered by a capacity target; an exhausted pool warns | no (ERROR) | market/checks.py |
| price_book | prices within bounds, cap, band and max step (great-expectations) | yes | market/checks.py |
| demand_forecast | rolling 80% coverage within 0.7-0.9 | no (ERROR) | market/checks.py |
| demand_forecast | persistence chosen by fallback | no (WARN) | market/checks.py |
| scaling_plan | certificate margins >= 0 (targets, approved removals) | yes | scaling/checks.py |
| scaling_plan | no node cordoned or uncordoned more than twice a day | no (ERROR) | scaling/checks.py |
| scaling_plan | no scale-down drain failed at this tick (else each node and why) | no (WARN) | scaling/checks.py |
| drain_requests | drains within the tenant caps and pool budgets | yes | drains/checks.py |
| fleet_inventory | no guaranteed task waits past its SLA beside drainable work | no (WARN) | fleet/checks.py |

Checks name their asset by key, so no check module imports an asset module (the forecast's two
run inside `demand_forecast`, which has the pool results in hand: `forecast_check_results`).
"""

import dagster as dg

from assets.lib.metadata import table_metadata
from market_pipeline.decision_checks import Verdict


def verdict_result(
    verdict: Verdict,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    check_name: str | None = None,
    **extra: object,
) -> dg.AssetCheckResult:
    """A verdict as the check result: its key numbers top-level, the offenders as a table. An
    expected outcome (`Verdict.expected`) that did not pass warns instead: a blocking check
    then lets its asset's dependents run (they publish the prices in force or the shield's)."""
    if not verdict.passed and verdict.expected:
        severity = dg.AssetCheckSeverity.WARN
    metadata: dict[str, object] = {**verdict.numbers, **extra, "offenders": len(verdict.offenders)}
    if verdict.offenders:
        metadata["offending"] = table_metadata(verdict.offenders)
    return dg.AssetCheckResult(
        passed=verdict.passed,
        severity=severity,
        description=verdict.description,
        metadata=metadata,
        check_name=check_name,
    )
