"""Limits on task drains: do-not-drain, landing cool-down, tenant caps, pool budgets.

Disruption budgets follow Karpenter's semantics: a budget allows `nodes` (a count) or
`percent` of the pool's nodes (rounded up) to be disrupted at once, optionally only for
some reasons and only inside a cron window (`schedule` + `duration_minutes`); when several
budgets apply, the most restrictive wins. A node counts as disrupted while any drain on it
is decided but not finished.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter

from market_pipeline.hardware.protocol import TaskInfo

TENANT_CAP_WINDOW = timedelta(hours=24)
NOT_DISRUPTIVE_OUTCOMES = frozenset({"aborted", "expired"})


class DrainReason(str, enum.Enum):
    PRESSURE = "pressure"  # pool allocation above the pressure threshold
    SCALE_DOWN = "scale_down"  # the scaler wants the node empty
    UNDER_USED = "under_used"  # the task sits on GPUs it does not use
    MANUAL = "manual"  # an operator asked
    BUDGET = "budget"  # the tenant's balance or hard cap ran out (billing budget guard)


class DrainLimitsError(ValueError):
    """A drain limit is misconfigured; names the field."""


@dataclass(frozen=True)
class DisruptionBudget:
    nodes: int | None = None
    percent: float | None = None
    reasons: frozenset[DrainReason] = frozenset()  # empty: every reason
    schedule: str | None = None
    duration_minutes: float | None = None

    def __post_init__(self) -> None:
        if (self.nodes is None) == (self.percent is None):
            raise DrainLimitsError("budget: give exactly one of nodes or percent")
        if self.nodes is not None and self.nodes < 0:
            raise DrainLimitsError(f"budget.nodes must be >= 0, got {self.nodes}")
        if self.percent is not None and not 0 <= self.percent <= 100:
            raise DrainLimitsError(f"budget.percent must be in 0..100, got {self.percent}")
        if (self.schedule is None) != (self.duration_minutes is None):
            raise DrainLimitsError("budget: schedule and duration_minutes go together")
        if self.schedule is not None and not croniter.is_valid(self.schedule):
            raise DrainLimitsError(f"budget.schedule {self.schedule!r} is not a cron expression")
        if self.duration_minutes is not None and self.duration_minutes <= 0:
            raise DrainLimitsError("budget.duration_minutes must be > 0")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], where: str = "budget") -> "DisruptionBudget":
        """From a mapping like {"nodes": "10%", "reasons": ["under_used"], "schedule":
        "0 9 * * 1-5", "duration_minutes": 480}."""
        unknown = set(raw) - {"nodes", "reasons", "schedule", "duration_minutes"}
        if unknown:
            raise DrainLimitsError(f"{where}: unknown key(s) {sorted(unknown)}")
        value = str(raw.get("nodes", "")).strip()
        try:
            nodes, percent = (None, float(value[:-1])) if value.endswith("%") else (int(value), None)
        except ValueError:
            raise DrainLimitsError(f"{where}.nodes: expected a count or 'N%', got {value!r}") from None
        try:
            reasons = frozenset(DrainReason(r) for r in raw.get("reasons", ()))
        except ValueError as exc:
            raise DrainLimitsError(f"{where}.reasons: {exc}") from None
        try:
            return cls(nodes, percent, reasons, raw.get("schedule"), raw.get("duration_minutes"))
        except DrainLimitsError as exc:
            raise DrainLimitsError(f"{where}: {exc}") from None

    def active(self, now: datetime) -> bool:
        if self.schedule is None:
            return True
        last_fire = croniter(self.schedule, now).get_prev(datetime)
        return now < last_fire + timedelta(minutes=float(self.duration_minutes or 0))

    def applies_to(self, reason: DrainReason) -> bool:
        return not self.reasons or reason in self.reasons

    def allowed_nodes(self, pool_nodes: int) -> int:
        if self.nodes is not None:
            return self.nodes
        return math.ceil(pool_nodes * float(self.percent or 0) / 100.0 - 1e-9)


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
        return sum(1 for e in self.entries if e.tenant_id == tenant_id and e.decided_at >= since
                   and e.outcome not in NOT_DISRUPTIVE_OUTCOMES)

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
    budgets: tuple[DisruptionBudget, ...]
    decision_ttl_seconds: float  # an approved drain not started by then expires

    @classmethod
    def from_config(cls, config: Any,
                    extra_budgets: Sequence[DisruptionBudget] = ()) -> "DrainLimits":
        """The shipped [guardrails.task_drain] limits, plus scheduled/reason budgets if any."""
        section = config.guardrails.task_drain
        default = DisruptionBudget(percent=section.pool_disruption_budget_pct)
        configured = parse_budgets((b.model_dump(exclude_none=True) for b in section.budgets),
                                   "guardrails.task_drain.budgets")
        tick = config.loop.tick_minutes * 60.0
        return cls(tenant_max_drains_per_day=section.tenant_max_drains_per_day,
                   landing_cooldown_minutes=section.landing_cooldown_minutes,
                   budgets=(default, *configured, *extra_budgets),
                   decision_ttl_seconds=max(3 * tick, section.max_total_seconds + tick))

    def pool_allowance(self, reason: DrainReason, pool_nodes: int, now: datetime) -> int | None:
        """Most restrictive active budget for this reason; None when none applies."""
        caps = [b.allowed_nodes(pool_nodes) for b in self.budgets
                if b.applies_to(reason) and b.active(now)]
        return min(caps) if caps else None

    def blockers(self, task: TaskInfo, reason: DrainReason, *, fleet_now: datetime,
                 ledger_now: datetime, ledger: DrainLedger, pool_nodes: int) -> list[str]:
        """Why this drain may not happen now; empty when every limit allows it."""
        found = []
        if task.do_not_drain:
            found.append(f"do_not_drain: task {task.task_id} is protected")
        age_min = (fleet_now - task.started_at).total_seconds() / 60.0
        if age_min < self.landing_cooldown_minutes:
            found.append(f"landing_cooldown: landed {age_min:.1f} min ago "
                         f"< {self.landing_cooldown_minutes:g} min")
        # The cap shields a tenant from disruption the platform causes; a tenant whose own
        # balance ran out is stopped whatever it had drained today (pool budgets still apply).
        used = ledger.tenant_drains_since(task.tenant_id, ledger_now - TENANT_CAP_WINDOW)
        if reason is not DrainReason.BUDGET and used + 1 > self.tenant_max_drains_per_day:
            found.append(f"tenant_cap: {task.tenant_id} had {used} drain(s) in 24 h, "
                         f"cap {self.tenant_max_drains_per_day}")
        allowance = self.pool_allowance(reason, pool_nodes, ledger_now)
        if allowance is not None:
            busy = ledger.disrupting_nodes(task.pool_id, ledger_now, self.decision_ttl_seconds)
            if len(busy | {task.node_id}) > allowance:
                found.append(f"pool_budget: {task.pool_id} allows {allowance} of {pool_nodes} "
                             f"node(s) disrupted for {reason.value}, {len(busy)} busy")
        return found


def parse_budgets(raw: Iterable[Mapping[str, Any]], where: str = "budgets") -> tuple[DisruptionBudget, ...]:
    return tuple(DisruptionBudget.parse(item, f"{where}.{i}") for i, item in enumerate(raw))
