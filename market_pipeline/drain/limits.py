"""Limits on task drains: do-not-drain, landing cool-down, tenant caps, and the rules of the
pool disruption budget (`disruption_budget`: one budget per tick, shared with the scaler).

A node counts as disrupted while any drain on it is decided but not finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from market_pipeline.disruption.budget import (
    BudgetRule,
    DisruptionBudget,
    DisruptionReason,
    PoolBudget,
    allowance,
    parse_rules,
)
from market_pipeline.hardware.protocol import NodeInfo, NodeState, TaskInfo

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

TENANT_CAP_WINDOW = timedelta(hours=24)
NOT_DISRUPTIVE_OUTCOMES = frozenset({"aborted", "expired"})


# The drain code and the readers of stored drains (decision checks, the simulator) name the
# reasons this way; the enum is the disruption budget's, one for the scaler and the drains.
DrainReason = DisruptionReason


@dataclass(frozen=True)
class LedgerEntry:
    """One approved drain decision, as the limits need it."""

    decision_id: str
    task_id: str
    tenant_id: str
    pool_id: str
    node_id: str
    decided_at: datetime
    outcome: str | None = None  # None while pending or running


@dataclass
class DrainLedger:
    """Approved drains of the recent past (one shadow mode at a time)."""

    entries: list[LedgerEntry] = field(default_factory=list)

    def add(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)

    def tenant_drains_since(self, tenant_id: str, since: datetime) -> int:
        return sum(
            1
            for e in self.entries
            if e.tenant_id == tenant_id and e.decided_at >= since and e.outcome not in NOT_DISRUPTIVE_OUTCOMES
        )

    def open_entries(self, now: datetime, ttl_seconds: float) -> list[LedgerEntry]:
        since = now - timedelta(seconds=ttl_seconds)
        return [e for e in self.entries if e.outcome is None and e.decided_at >= since]

    def disrupting_nodes(self, pool_id: str, now: datetime, ttl_seconds: float) -> set[str]:
        return {e.node_id for e in self.open_entries(now, ttl_seconds) if e.pool_id == pool_id}

    def open_task_ids(self, now: datetime, ttl_seconds: float) -> set[str]:
        return {e.task_id for e in self.open_entries(now, ttl_seconds)}


@dataclass(frozen=True)
class DrainLimits:
    tenant_max_drains_per_day: int
    landing_cooldown_minutes: float
    budgets: tuple[BudgetRule, ...]  # the pool disruption budget's rules
    decision_ttl_seconds: float  # an approved drain not started by then expires

    @classmethod
    def from_config(
        cls, config: MarketPipelineConfig, extra_budgets: Sequence[BudgetRule] = ()
    ) -> DrainLimits:
        """The shipped [guardrails.task_drain] limits, plus scheduled/reason budgets if any."""
        section = config.guardrails.task_drain
        tick = config.loop.tick_minutes * 60.0
        return cls(
            tenant_max_drains_per_day=section.tenant_max_drains_per_day,
            landing_cooldown_minutes=section.landing_cooldown_minutes,
            budgets=(*budget_rules(config), *extra_budgets),
            decision_ttl_seconds=max(3 * tick, section.max_total_seconds + tick),
        )

    def pool_allowance(self, reason: DisruptionReason, pool_nodes: int, now: datetime) -> int | None:
        """Most restrictive active budget for this reason; None when none applies."""
        return allowance(self.budgets, reason, pool_nodes, now)

    def tick_budget(
        self, nodes: Sequence[NodeInfo], tasks: Sequence[TaskInfo], ledger: DrainLedger, now: datetime
    ) -> DisruptionBudget:
        """The tick's one budget from the fleet and the drain ledger (see `disruption_budget`).

        Disrupting now: nodes with an open drain, and cordoned nodes that still run tasks (a
        scale-down or a repair moving work off them)."""
        pool_nodes: dict[str, int] = {}
        disrupting: dict[str, set[str]] = {}
        busy_nodes = {t.node_id for t in tasks}
        for node in nodes:
            if node.state is NodeState.ON:
                pool_nodes[node.pool_id] = pool_nodes.get(node.pool_id, 0) + 1
                if node.cordoned and node.node_id in busy_nodes:
                    disrupting.setdefault(node.pool_id, set()).add(node.node_id)
        for entry in ledger.open_entries(now, self.decision_ttl_seconds):
            disrupting.setdefault(entry.pool_id, set()).add(entry.node_id)
        return DisruptionBudget(self.budgets, now, pool_nodes, disrupting)

    def task_blockers(
        self,
        task: TaskInfo,
        reason: DisruptionReason,
        *,
        fleet_now: datetime,
        ledger_now: datetime,
        ledger: DrainLedger,
    ) -> list[str]:
        """Why this task may not be drained now, the pool budget aside; empty when none."""
        found = []
        if task.do_not_drain:
            found.append(f"do_not_drain: task {task.task_id} is protected")
        age_min = (fleet_now - task.started_at).total_seconds() / 60.0
        if age_min < self.landing_cooldown_minutes:
            found.append(
                f"landing_cooldown: landed {age_min:.1f} min ago < {self.landing_cooldown_minutes:g} min"
            )
        # The cap shields a tenant from disruption the platform causes; a tenant whose own
        # balance ran out is stopped whatever it had drained today (pool budgets still apply).
        used = ledger.tenant_drains_since(task.tenant_id, ledger_now - TENANT_CAP_WINDOW)
        if reason is not DisruptionReason.BUDGET and used + 1 > self.tenant_max_drains_per_day:
            found.append(
                f"tenant_cap: {task.tenant_id} had {used} drain(s) in 24 h, "
                f"cap {self.tenant_max_drains_per_day}"
            )
        return found

    def blockers(
        self,
        task: TaskInfo,
        reason: DisruptionReason,
        *,
        fleet_now: datetime,
        ledger_now: datetime,
        ledger: DrainLedger,
        pool_nodes: int,
    ) -> list[str]:
        """Every limit on one drain checked against `ledger` alone (the simulator's trial
        ledgers); the planner checks the pool budget against the tick's shared budget."""
        found = self.task_blockers(task, reason, fleet_now=fleet_now, ledger_now=ledger_now, ledger=ledger)
        busy = ledger.disrupting_nodes(task.pool_id, ledger_now, self.decision_ttl_seconds)
        blocker = PoolBudget(task.pool_id, pool_nodes, self.budgets, ledger_now, busy).blocker(
            reason, task.node_id
        )
        return found + ([blocker] if blocker else [])


def budget_rules(config: MarketPipelineConfig) -> tuple[BudgetRule, ...]:
    """The flat `pool_disruption_budget_pct` and the configured rules by reason and window."""
    section = config.guardrails.task_drain
    return (
        BudgetRule(percent=section.pool_disruption_budget_pct),
        *parse_rules(
            (b.model_dump(exclude_none=True) for b in section.budgets), "guardrails.task_drain.budgets"
        ),
    )
