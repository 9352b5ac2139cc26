"""Budget-guard drains: tenants the billing budget guards blocked, as drain triggers.

The billing budget guards (`market_pipeline/billing/balances.py`) write `decisions` of kind
`budget_guard` when a guarded tenant's balance cannot cover the next interval or a hard cap
is reached: one `refuse_new_tasks` per tenant (with `drain_after` = decision time + the
billing grace period in its inputs) and one `drain` per task running then. The drain
planner reads them here: once `drain_after` has passed on the fleet's clock (the clock the
guard decided on), every running task of such a tenant is a drain candidate with reason
`budget` -- also tasks started after the guard ran, since a tenant out of budget may not
keep any running. The guardrail's limits still apply to these drains.

A guard decision stands for BUDGET_DECISION_TTL (the guard is re-evaluated every hour, and
a tenant that was topped up is not blocked again); the guard's own drain decisions for the
same tasks are not executed directly -- they only record the intent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from market_pipeline.warehouse import Warehouse, drain_decisions
from market_pipeline.warehouse.decision_inputs import BudgetGuardInputs
from market_pipeline.warehouse.decisions import DecisionAction, DecisionKind

BUDGET_DECISION_TTL = timedelta(hours=1, minutes=5)  # one guard cadence, plus slack


@dataclass(frozen=True)
class BudgetBlock:
    """A tenant a budget guard blocked: drain its running tasks from `drain_after` on."""

    tenant_id: str
    decision_id: str
    decided_at: datetime
    drain_after: datetime
    reasons: tuple[str, ...]

    def trigger(self) -> str:
        why = "; ".join(self.reasons) or "budget guard"
        return f"tenant {self.tenant_id} out of budget ({why}), guard decision {self.decision_id}"


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)


def load_budget_blocks(warehouse: Warehouse, fleet_now: datetime, shadow: bool) -> dict[str, BudgetBlock]:
    """tenant -> its newest standing budget-guard block whose grace period is over.

    Live planning reads live guard decisions only; shadow planning reads both (it only
    records). A block whose `drain_after` lies in the future is not returned yet.
    """
    since = fleet_now - BUDGET_DECISION_TTL
    rows = drain_decisions.allowed_decisions_between(
        warehouse,
        DecisionKind.BUDGET_GUARD.value,
        DecisionAction.REFUSE_NEW_TASKS.value,
        shadow,
        since,
        fleet_now,
    )
    blocks: dict[str, BudgetBlock] = {}
    for decision_id, tenant, reasons, inputs, decided in rows:
        decided_at = _utc(decided)
        stored_after = BudgetGuardInputs.from_json(inputs).drain_after
        drain_after = _utc(stored_after) if stored_after is not None else decided_at
        if drain_after > fleet_now:
            continue  # still in the grace period
        blocks[tenant] = BudgetBlock(
            tenant, decision_id, decided_at, drain_after, tuple(reasons or ())
        )  # later rows replace earlier ones
    return blocks


def budget_triggers(blocks: Mapping[str, BudgetBlock]) -> dict[str, str]:
    """tenant -> trigger text, for PlanningInputs.budget_blocked_tenants."""
    return {tenant: block.trigger() for tenant, block in blocks.items()}
