"""No flapping: a node is cordoned (taken out of service) or uncordoned at most twice a day.

Counted from the live scaling decisions the plan approved (`decisions`, kind 'scale'), in
the 24 hours up to the plan's own tick; a batch a later plan superseded never touched the
node and does not count. `replace` cordons an unhealthy node, so it counts as a cordon.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from market_pipeline.decision_checks.verdict import Verdict
from market_pipeline.warehouse import Warehouse, readers
from market_pipeline.warehouse.decisions import DecisionAction, DecisionKind, DecisionOutcome

MAX_PER_DAY = 2
WINDOW = timedelta(hours=24)
CORDONS = (DecisionAction.CORDON.value, DecisionAction.REPLACE.value)
NOT_CARRIED_OUT = tuple(
    o.value
    for o in (
        DecisionOutcome.SUPERSEDED,
        DecisionOutcome.INFEASIBLE,
        DecisionOutcome.FAILED,
        DecisionOutcome.ERROR,
    )
)


def node_actions(store: Warehouse, until: datetime | None = None) -> pl.DataFrame:
    """Approved live cordon/uncordon decisions (target, action, decided_at, outcome) in the
    24 h up to `until` (default: the latest scaling decision)."""
    if until is None:
        until = readers.latest_decision_at(store, DecisionKind.SCALE.value)
        if until is None:
            return pl.DataFrame(
                schema={
                    "target": pl.Utf8,
                    "action": pl.Utf8,
                    "decided_at": pl.Datetime("us", "UTC"),
                    "outcome": pl.Utf8,
                }
            )
    return readers.approved_node_actions(store, until - WINDOW, until)


def flapping_verdict(actions: pl.DataFrame, limit: int = MAX_PER_DAY) -> Verdict:
    """Fails when a node has more than `limit` cordons, or more than `limit` uncordons, in
    `actions` (one day of them: `node_actions`)."""
    status = pl.col("outcome").str.split(":").list.first().str.strip_chars()  # "<status>: <detail>"
    counted = actions.filter(pl.col("outcome").is_null() | ~status.is_in(NOT_CARRIED_OUT))
    per_node = (
        counted.group_by("target")
        .agg(
            pl.col("action").is_in(CORDONS).sum().alias("cordons"),
            (pl.col("action") == DecisionAction.UNCORDON.value).sum().alias("uncordons"),
            pl.col("decided_at").min().alias("first"),
            pl.col("decided_at").max().alias("last"),
        )
        .sort("target")
    )
    offenders = [
        {
            "node_id": r["target"],
            "cordons": int(r["cordons"]),
            "uncordons": int(r["uncordons"]),
            "first": r["first"].isoformat(),
            "last": r["last"].isoformat(),
        }
        for r in per_node.iter_rows(named=True)
        if max(r["cordons"], r["uncordons"]) > limit
    ]
    busiest = (
        int(per_node.select(pl.max_horizontal("cordons", "uncordons").max()).item() or 0)
        if per_node.height
        else 0
    )
    return Verdict.from_offenders(
        offenders,
        f"{per_node.height} node(s) cordoned or uncordoned in 24 h, at most {busiest} times each "
        f"(limit {limit})",
        "{n} node(s) cordoned or uncordoned more than "
        + f"{limit} times in 24 h: "
        + ", ".join(f"{o['node_id']} ({o['cordons']}+{o['uncordons']})" for o in offenders),
        nodes_acted_on=per_node.height,
        most_actions_per_node=busiest,
    )
