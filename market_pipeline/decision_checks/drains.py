"""Task drains within their limits, re-counted from what was stored.

The planner (`drain.plan`) enforces the limits as it decides; this check
re-counts the approved live drains in `decisions` afterwards, so a drain approved past a
limit (a second writer, a rerun that lost its ledger, a planner defect) fails the check:

- tenant cap: at most `tenant_max_drains_per_day` disruptive drains per tenant in 24 h
  (a drain for the tenant's own budget is exempt, and an aborted or expired one disrupted
  nothing: the planner's own rules);
- pool budget: the nodes with an open (approved, not finished) drain per pool at most the
  most restrictive disruption budget active for the drain's reason.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from market_pipeline.decision_checks.verdict import Verdict
from market_pipeline.drain.limits import (
    NOT_DISRUPTIVE_OUTCOMES,
    TENANT_CAP_WINDOW,
    DrainLimits,
    DrainReason,
)
from market_pipeline.warehouse import Warehouse, readers
from market_pipeline.warehouse.decisions import DecisionKind

DRAIN_COLUMNS = {
    "decision_id": pl.Utf8,
    "pool_id": pl.Utf8,
    "tenant_id": pl.Utf8,
    "node_id": pl.Utf8,
    "trigger": pl.Utf8,
    "decided_at": pl.Datetime("us", "UTC"),
    "outcome": pl.Utf8,
}


def approved_drains(store: Warehouse) -> tuple[pl.DataFrame, datetime | None]:
    """Approved live drains of the last day up to the latest drain decision, and that time."""
    latest = readers.latest_decision_at(store, DecisionKind.DRAIN.value)
    if latest is None:
        return pl.DataFrame(schema=DRAIN_COLUMNS), None
    frame = readers.approved_live_drains(store, latest - TENANT_CAP_WINDOW, latest)
    return frame, latest


def drain_limits_verdict(
    drains: pl.DataFrame, now: datetime | None, limits: DrainLimits, pool_nodes: dict[str, int]
) -> Verdict:
    """Fails when a tenant's drains pass its daily cap or a pool's open drains its budget."""
    if now is None or drains.is_empty():
        return Verdict(True, "no approved drains in the last 24 h", numbers={"approved_24h": 0})
    offenders: list[dict[str, object]] = []
    disruptive = drains.filter(
        (pl.col("trigger") != DrainReason.BUDGET.value)
        & (pl.col("outcome").is_null() | ~pl.col("outcome").is_in(NOT_DISRUPTIVE_OUTCOMES))
    )
    for row in disruptive.group_by("tenant_id").len().sort("tenant_id").iter_rows(named=True):
        if row["len"] > limits.tenant_max_drains_per_day:
            offenders.append(
                {
                    "limit": "tenant_cap",
                    "who": row["tenant_id"],
                    "count": int(row["len"]),
                    "allowed": limits.tenant_max_drains_per_day,
                }
            )
    open_since = now - pl.duration(seconds=limits.decision_ttl_seconds)
    open_drains = drains.filter(pl.col("outcome").is_null() & (pl.col("decided_at") >= open_since))
    for (pool_id, trigger), group in open_drains.group_by("pool_id", "trigger"):
        allowance = limits.pool_allowance(DrainReason(trigger), pool_nodes.get(pool_id, 0), now)
        busy = open_drains.filter(pl.col("pool_id") == pool_id)["node_id"].n_unique()
        if allowance is not None and busy > allowance:
            offenders.append(
                {"limit": "pool_budget", "who": f"{pool_id} ({trigger})", "count": busy, "allowed": allowance}
            )
    offenders.sort(key=lambda o: (str(o["limit"]), str(o["who"])))
    return Verdict.from_offenders(
        offenders,
        f"{drains.height} approved drain(s) in 24 h within the tenant caps "
        f"({limits.tenant_max_drains_per_day} a day) and the pool budgets; {open_drains.height} open",
        "{n} limit(s) passed: "
        + "; ".join(f"{o['limit']} {o['who']} {o['count']} > {o['allowed']}" for o in offenders),
        approved_24h=drains.height,
        open_drains=open_drains.height,
    )
