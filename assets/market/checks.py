"""The market's decision checks: the equilibrium's solve and margins, the price book's
promises, and the demand forecast's coverage (the table of every decision check is in
assets/lib/verdicts.py; each stage's own are in its checks.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from collections.abc import Iterator, Sequence

import dagster as dg
import polars as pl

from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.lib.verdicts import verdict_result
from market_pipeline.decision_checks import Verdict
from market_pipeline.decision_checks.margins import tick_margin_verdict
from market_pipeline.decision_checks.prices import (
    offending_prices,
    price_rules,
    promise_frame,
)
from market_pipeline.decision_checks.solve import solve_verdict
from market_pipeline.forecast.operator import coverage_check, operator_metadata
from market_pipeline.forecast.pools import PoolResult
from market_pipeline.warehouse.readers import (
    latest_tick,
    latest_tick_at,
    latest_tick_solve,
    published_with_previous,
)

EQUILIBRIUM, PRICE_BOOK = dg.AssetKey("equilibrium_prices"), dg.AssetKey("price_book")
DEMAND_FORECAST = dg.AssetKey("demand_forecast")
FORECAST_COVERAGE, FORECAST_FALLBACK = "forecast_coverage_80", "forecast_no_fallback"


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


market_checks = [equilibrium_checks, price_book_promises]
