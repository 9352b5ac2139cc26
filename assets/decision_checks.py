"""Asset checks on every decision asset of the control loop. Each wraps a plain function of
`market_pipeline.decision_checks` (or the forecast's `coverage_check`); a blocking check
stops what depends on its asset in the same run, so a bad decision does not flow on.

| asset | check | blocks |
|---|---|---|
| equilibrium_prices | solve certified (status, KKT <= tolerance); a fallback warns | yes |
| equilibrium_prices | negative margins answered by a capacity target; an exhausted pool warns | no (ERROR) |
| price_book | prices within bounds, cap, band and max step (great-expectations) | yes |
| scaling_plan | certificate margins >= 0 (targets, approved removals) | yes |
| scaling_plan | no node cordoned or uncordoned more than twice a day | no (ERROR) |
| scaling_plan | no scale-down drain failed at this tick (else each node and why) | no (WARN) |
| drain_requests | drains within the tenant caps and pool budgets | yes |
| demand_forecast | rolling 80% coverage within 0.7-0.9 | no (ERROR) |
| demand_forecast | persistence chosen by fallback | no (WARN) |

Checks name their asset by key, so this module imports no asset module (the forecast's two
run inside `demand_forecast`, which has the pool results in hand: `forecast_check_results`).
"""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from collections.abc import Iterator, Sequence

import dagster as dg
import polars as pl

from assets.metadata import table_metadata
from assets.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.decision_checks import Verdict
from market_pipeline.decision_checks.drains import approved_drains, drain_limits_verdict
from market_pipeline.decision_checks.flapping import MAX_PER_DAY, flapping_verdict, node_actions
from market_pipeline.decision_checks.guarantee import rigid_guarantee_verdict
from market_pipeline.decision_checks.margins import plan_margin_verdict, tick_margin_verdict
from market_pipeline.decision_checks.node_drains import node_drain_verdict
from market_pipeline.decision_checks.prices import (
    offending_prices,
    price_rules,
    promise_frame,
)
from market_pipeline.decision_checks.solve import solve_verdict
from market_pipeline.drain.limits import DrainLimits
from market_pipeline.forecast.operator import coverage_check, operator_metadata
from market_pipeline.forecast.pools import PoolResult
from market_pipeline.warehouse.readers import (
    latest_plan,
    latest_tick,
    latest_tick_at,
    latest_tick_solve,
    latest_uncordons,
    pool_nodes_on,
    published_with_previous,
)

EQUILIBRIUM, PRICE_BOOK = dg.AssetKey("equilibrium_prices"), dg.AssetKey("price_book")
SCALING_PLAN, DRAIN_REQUESTS = dg.AssetKey("scaling_plan"), dg.AssetKey("drain_requests")
DEMAND_FORECAST = dg.AssetKey("demand_forecast")
FORECAST_COVERAGE, FORECAST_FALLBACK = "forecast_coverage_80", "forecast_no_fallback"


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


EQUILIBRIUM_SPECS = [
    dg.AssetCheckSpec(
        "equilibrium_solve_certified",
        asset=EQUILIBRIUM,
        blocking=True,
        description="The tick's equilibrium solve is certified: converged (or proved capacity "
        "short at price_max) with its KKT residual within market.solver_tolerance. A fallback "
        "to the prices in force, with its reason, warns (an expected outcome); a solver defect "
        "(no report, an unknown status, a certified status over tolerance) fails.",
    ),
    # Not blocking: an uncertified pool needs the shielded price published and capacity
    # planned, which is what runs downstream; stopping them would leave it worse.
    dg.AssetCheckSpec(
        "equilibrium_margins",
        asset=EQUILIBRIUM,
        description="Backlog-certificate margins: each pool certifies at its serving capacity "
        "(margin >= 0) or its capacity target asks for the capacity that would.",
    ),
]


# One step per asset for its checks: each step costs the control tick about half a second.
@dg.multi_asset_check(specs=EQUILIBRIUM_SPECS, name="equilibrium_prices_checks")
def equilibrium_checks(
    fleet: FleetAdapterResource, warehouse: WarehouseResource
) -> Iterator[dg.AssetCheckResult]:
    store = warehouse.reader()
    solve = latest_tick_solve(store)
    extra = {"status": str(solve["status"]), "solve_id": str(solve["solve_id"])} if solve else {}
    yield verdict_result(
        solve_verdict(solve, fleet.config().market.solver_tolerance),
        check_name="equilibrium_solve_certified",
        **extra,
    )
    tick_at = latest_tick_at(store)
    tick = latest_tick(store, tick_at) if tick_at is not None else pl.DataFrame()
    yield verdict_result(
        tick_margin_verdict(tick) if tick.height else Verdict(False, "no market tick stored"),
        check_name="equilibrium_margins",
    )


@dg.asset_check(
    asset=PRICE_BOOK,
    blocking=True,
    description="great-expectations rules on the latest published prices: within "
    "price_min..price_max, the guaranteed cap against list, the drainable band "
    "and the max step from the price in force.",
)
def price_book_promises(fleet: FleetAdapterResource, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    published = published_with_previous(warehouse.reader())
    if published.is_empty():
        return verdict_result(Verdict(False, "the price book is empty"))
    frame = promise_frame(published, fleet.config())
    report = price_rules(frame)
    broken = offending_prices(frame)
    failed = ", ".join(f"{r.expectation}({r.column})" for r in report.failed)
    verdict = Verdict(
        report.passed,
        f"{len(report.rules)} rules on {report.rows} published prices"
        + (f"; failed: {failed}" if failed else ""),
        broken.to_dicts(),
        {"prices": report.rows, "rules_failed": len(report.failed)},
    )
    return verdict_result(
        verdict,
        rules=dg.MetadataValue.md(report.markdown()),
        effective_from=str(published["effective_from"][0]),
    )


SCALING_SPECS = [
    dg.AssetCheckSpec(
        "scaling_plan_margins",
        asset=SCALING_PLAN,
        blocking=True,
        description="Certificate margins >= 0: every pool's capacity target certifies (below "
        "max_nodes) and no approved cordon or scale-down takes capacity it needs.",
    ),
    dg.AssetCheckSpec(
        "scaling_plan_no_flapping",
        asset=SCALING_PLAN,
        description=f"No flapping: no node cordoned or uncordoned more than {MAX_PER_DAY} times "
        "in the last 24 h of approved live scaling decisions.",
    ),
    dg.AssetCheckSpec(
        "scaling_plan_node_drains",
        asset=SCALING_PLAN,
        description="Scale-down drains that failed at this tick (timed out or blocked; the node "
        "uncordoned), each with its reason: an expected outcome, so it warns.",
    ),
]


@dg.multi_asset_check(specs=SCALING_SPECS, name="scaling_plan_checks")
def scaling_checks(warehouse: WarehouseResource) -> Iterator[dg.AssetCheckResult]:
    store = warehouse.reader()
    yield verdict_result(plan_margin_verdict(latest_plan(store)), check_name="scaling_plan_margins")
    yield verdict_result(flapping_verdict(node_actions(store)), check_name="scaling_plan_no_flapping")
    yield verdict_result(node_drain_verdict(latest_uncordons(store)), check_name="scaling_plan_node_drains")


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


FORECAST_CHECK_SPECS = [
    dg.AssetCheckSpec(
        FORECAST_COVERAGE,
        asset=DEMAND_FORECAST,
        description=(
            "Rolling 80% interval coverage (mean over pools, at 1 h and 4 h) within 0.7-0.9; "
            "the upper end rises by as much as ties (demand that did not move) lift the floor."
        ),
    ),
    dg.AssetCheckSpec(
        FORECAST_FALLBACK,
        asset=DEMAND_FORECAST,
        description="Warns when a pool's persistence forecast was chosen by fallback (no fit).",
    ),
]


def forecast_check_results(results: Sequence[PoolResult]) -> list[dg.AssetCheckResult]:
    """The two forecast checks from `coverage_check` (market_pipeline.forecast.operator)."""
    check = coverage_check(results)
    fallbacks = [w for w in check.warnings if "by fallback" in w]
    pooled = operator_metadata(results)
    numbers = {k: v for k, v in pooled.items() if k.startswith(("rolling_coverage", "rolling_tie_floor"))}
    return [
        dg.AssetCheckResult(
            check_name=FORECAST_COVERAGE,
            passed=check.passed,
            description=check.reason,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={
                **numbers,
                "pools_outside_band": dg.MetadataValue.json([w for w in check.warnings if "coverage" in w]),
            },
        ),
        dg.AssetCheckResult(
            check_name=FORECAST_FALLBACK,
            passed=not fallbacks,
            severity=dg.AssetCheckSeverity.WARN,
            description="; ".join(fallbacks)
            or f"{len(results)} pool(s) forecast by a fitted or validated model",
            metadata={"fallback_pools": len(fallbacks)},
        ),
    ]


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


decision_checks = [
    equilibrium_checks,
    price_book_promises,
    scaling_checks,
    drain_requests_within_limits,
    rigid_guarantee,
]
