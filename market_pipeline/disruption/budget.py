"""The one disruption budget, shaped like Karpenter's disruption controller.

Karpenter (kubernetes-sigs/karpenter `pkg/controllers/disruption`) computes, once per pass,
how many nodes each node pool may still have disrupted for each reason (the most restrictive
active budget, less the nodes already disrupting), and hands that mapping to its methods in
order (emptiness, drift, consolidation, ...); every method that disrupts a node consumes from
it. Here the methods are the scaler's (scale-down, node health) and the task-drain planner's
(room for waiting guaranteed tasks, pressure, operator, budget guard, scale-down drains,
under-used): both consume one `DisruptionBudget` built once per tick, so a scale-down and a
drain decided in the same tick cannot together exceed it.

Budget rules follow Karpenter's semantics: a rule allows `nodes` (a count) or `percent` of
the pool's nodes (rounded up) to be disrupted at once, optionally only for some reasons and
only inside a cron window (`schedule` + `duration_minutes`); the most restrictive active rule
wins. A node counts as disrupted while work on it is being moved (an open drain, a busy node
cordoned for removal or repair); an empty node disrupts nothing and costs no budget.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from croniter import croniter


class DisruptionReason(str, enum.Enum):
    """Why a node's work is disrupted; the stored `trigger` text is the value."""

    PRESSURE = "pressure"  # pool allocation above the pressure threshold
    SCALE_DOWN = "scale_down"  # the scaler wants the node empty
    UNDER_USED = "under_used"  # the task sits on GPUs it does not use
    MANUAL = "manual"  # an operator asked
    BUDGET = "budget"  # the tenant's balance or hard cap ran out (billing budget guard)
    NODE_HEALTH = "node_health"  # the node is unhealthy: replaced, then drained


class BudgetRuleError(ValueError):
    """A disruption budget rule is misconfigured; names the field."""


@dataclass(frozen=True)
class BudgetRule:
    """One configured budget: `nodes` or `percent` of the pool, for some reasons, in a window."""

    nodes: int | None = None
    percent: float | None = None
    reasons: frozenset[DisruptionReason] = frozenset()  # empty: every reason
    schedule: str | None = None
    duration_minutes: float | None = None

    def __post_init__(self) -> None:
        if (self.nodes is None) == (self.percent is None):
            raise BudgetRuleError("budget: give exactly one of nodes or percent")
        if self.nodes is not None and self.nodes < 0:
            raise BudgetRuleError(f"budget.nodes must be >= 0, got {self.nodes}")
        if self.percent is not None and not 0 <= self.percent <= 100:
            raise BudgetRuleError(f"budget.percent must be in 0..100, got {self.percent}")
        if (self.schedule is None) != (self.duration_minutes is None):
            raise BudgetRuleError("budget: schedule and duration_minutes go together")
        if self.schedule is not None and not croniter.is_valid(self.schedule):
            raise BudgetRuleError(f"budget.schedule {self.schedule!r} is not a cron expression")
        if self.duration_minutes is not None and self.duration_minutes <= 0:
            raise BudgetRuleError("budget.duration_minutes must be > 0")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], where: str = "budget") -> BudgetRule:
        """From a mapping like {"nodes": "10%", "reasons": ["under_used"], "schedule":
        "0 9 * * 1-5", "duration_minutes": 480}."""
        unknown = set(raw) - {"nodes", "reasons", "schedule", "duration_minutes"}
        if unknown:
            raise BudgetRuleError(f"{where}: unknown key(s) {sorted(unknown)}")
        value = str(raw.get("nodes", "")).strip()
        try:
            nodes, percent = (None, float(value[:-1])) if value.endswith("%") else (int(value), None)
        except ValueError:
            raise BudgetRuleError(f"{where}.nodes: expected a count or 'N%', got {value!r}") from None
        try:
            reasons = frozenset(DisruptionReason(r) for r in raw.get("reasons", ()))
        except ValueError as exc:
            raise BudgetRuleError(f"{where}.reasons: {exc}") from None
        try:
            return cls(nodes, percent, reasons, raw.get("schedule"), raw.get("duration_minutes"))
        except BudgetRuleError as exc:
            raise BudgetRuleError(f"{where}: {exc}") from None

    def active(self, now: datetime) -> bool:
        if self.schedule is None:
            return True
        # get_prev is strictly before its start: from `now` itself, a window opening at `now`
        # (a tick at 09:00:00 sharp) would look a day old; a microsecond later it has opened
        last_fire = croniter(self.schedule, now + timedelta(microseconds=1)).get_prev(datetime)
        return now < last_fire + timedelta(minutes=float(self.duration_minutes or 0))

    def applies_to(self, reason: DisruptionReason) -> bool:
        return not self.reasons or reason in self.reasons

    def allowed_nodes(self, pool_nodes: int) -> int:
        if self.nodes is not None:
            return self.nodes
        return math.ceil(pool_nodes * float(self.percent or 0) / 100.0 - 1e-9)


def parse_rules(raw: Iterable[Mapping[str, Any]], where: str = "budgets") -> tuple[BudgetRule, ...]:
    return tuple(BudgetRule.parse(item, f"{where}.{i}") for i, item in enumerate(raw))


def allowance(
    rules: Sequence[BudgetRule], reason: DisruptionReason, pool_nodes: int, now: datetime
) -> int | None:
    """Most restrictive active rule for this reason; None when none applies."""
    caps = [r.allowed_nodes(pool_nodes) for r in rules if r.applies_to(reason) and r.active(now)]
    return min(caps) if caps else None


@dataclass
class PoolBudget:
    """One pool's share of the tick's budget: who is disrupting, and what each reason allows."""

    pool_id: str
    pool_nodes: int  # nodes the percentages are of
    rules: tuple[BudgetRule, ...]
    now: datetime
    disrupting: set[str] = field(default_factory=set)  # nodes whose work is being moved
    _caps: dict[DisruptionReason, int | None] = field(default_factory=dict, repr=False)

    def cap(self, reason: DisruptionReason) -> int | None:
        """Nodes this reason may have disrupted at once (computed once per reason and tick)."""
        if reason not in self._caps:
            self._caps[reason] = allowance(self.rules, reason, self.pool_nodes, self.now)
        return self._caps[reason]

    def allows(self, reason: DisruptionReason, node_id: str) -> bool:
        """Whether the disrupting nodes, this one included, fit the reason's cap (a node already
        disrupting adds nothing, but a cap that shrank below them blocks it too)."""
        cap = self.cap(reason)
        return cap is None or len(self.disrupting | {node_id}) <= cap

    def blocker(self, reason: DisruptionReason, node_id: str) -> str | None:
        """The `pool_budget` reason a drain is blocked with, or None when it fits."""
        if self.allows(reason, node_id):
            return None
        return (
            f"pool_budget: {self.pool_id} allows {self.cap(reason)} of {self.pool_nodes} "
            f"node(s) disrupted for {reason.value}, {len(self.disrupting)} busy"
        )

    def consume(self, node_id: str) -> None:
        self.disrupting.add(node_id)


@dataclass
class DisruptionBudget:
    """The tick's budget for every pool: build it once, pass it to the scaler and the drains."""

    rules: tuple[BudgetRule, ...]
    now: datetime
    pool_nodes: Mapping[str, int]
    disrupting: Mapping[str, Iterable[str]] = field(default_factory=dict)
    _pools: dict[str, PoolBudget] = field(default_factory=dict, repr=False)

    def pool(self, pool_id: str) -> PoolBudget:
        if pool_id not in self._pools:
            self._pools[pool_id] = PoolBudget(
                pool_id,
                int(self.pool_nodes.get(pool_id, 0)),
                self.rules,
                self.now,
                set(self.disrupting.get(pool_id, ())),
            )
        return self._pools[pool_id]


P = TypeVar("P", contravariant=True)


class DisruptionMethod(Protocol[P]):
    """One reason to disrupt (Karpenter's `Method`): it picks its candidates in its own order
    (ShouldDisrupt) and decides each through the one budget, consuming from it
    (ComputeCommand). `P` is the pass it works on: the scaler's tick or the drain batch."""

    @property
    def reason(self) -> DisruptionReason: ...

    def compute(self, plan: P, budget: DisruptionBudget) -> None: ...


def run_methods(methods: Sequence[DisruptionMethod[P]], plan: P, budget: DisruptionBudget) -> None:
    """Each method in order, all consuming from the same budget (earlier methods go first)."""
    for method in methods:
        method.compute(plan, budget)
