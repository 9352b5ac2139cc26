"""The scaling plan's checks (the shared table is in assets/lib/verdicts.py)."""

# No `from __future__ import annotations`: Dagster inspects the context annotations at runtime.
from collections.abc import Iterator

import dagster as dg

from assets.lib.resources import WarehouseResource
from assets.lib.verdicts import verdict_result
from market_pipeline.decision_checks.flapping import MAX_PER_DAY, flapping_verdict, node_actions
from market_pipeline.decision_checks.margins import plan_margin_verdict
from market_pipeline.decision_checks.node_drains import node_drain_verdict
from market_pipeline.warehouse.readers import latest_plan, latest_uncordons

SCALING_PLAN = dg.AssetKey("scaling_plan")


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


scaling_plan_checks = [scaling_checks]
