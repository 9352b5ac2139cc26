"""Which tasks to drain this tick: triggers, ordering and limits -> drain decisions.

The triggers are disruption methods (`drain.triggers.DRAIN_METHODS`), most urgent
first: room for waiting guaranteed tasks, pool pressure, operator requests, the billing budget
guard, the scaler's scale-down, under-use. Each triggered task gets one decision, approved or blocked with its reasons; an
approval counts against the caps of the decisions after it and consumes from the tick's one
disruption budget (`disruption_budget`), which the scaler's methods consume from as well.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

import polars as pl

from market_pipeline.disruption.budget import DisruptionBudget, PoolBudget, run_methods
from market_pipeline.drain.limits import (
    DrainLedger,
    DrainLimits,
    DrainReason,
    LedgerEntry,
)
from market_pipeline.drain.protocol import task_to_dict
from market_pipeline.drain.score import (
    DrainabilityScore,
    DrainHistory,
    UtilisationStats,
    candidate_order,
    drainability_score,
    history_for,
    task_utilisation,
)
from market_pipeline.drain.triggers import DRAIN_METHODS
from market_pipeline.hardware.protocol import NodeInfo, NodeState, TaskInfo, WaitingTask
from market_pipeline.placement.guarantee import drain_after_seconds
from market_pipeline.warehouse.decision_inputs import DrainInputs
from market_pipeline.warehouse.decisions import DecisionAction, DecisionKind, DecisionRow
from market_pipeline.warehouse.decisions import decisions_frame as warehouse_decisions_frame

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

SCORE_EXEMPT = frozenset({DrainReason.MANUAL, DrainReason.BUDGET})


@dataclass(frozen=True)
class SelectionPolicy:
    under_use_util_pct: float
    under_use_minutes: float
    pressure_util_pct: float
    min_score: float = 0.4
    sample_interval_seconds: float = 60.0
    tick_minutes: float = 5.0
    # a waiting guaranteed task is drained for once it has waited this long, or at once where it
    # needs a whole node (`placement.guarantee.drain_due`); 0: at the first pass
    guaranteed_drain_after_seconds: float = 0.0
    # ... and is still in time while it has waited at most this long (its SLA wait less the
    # drain's time); which due tasks a pass drains for, in what order
    # (`placement.guarantee.drain_order`)
    guaranteed_in_time_seconds: float = math.inf
    late_drains: str = "oldest_first"

    @classmethod
    def from_config(cls, config: MarketPipelineConfig, min_score: float = 0.4) -> "SelectionPolicy":
        section = config.guardrails.task_drain
        guarantee = config.guardrails.rigid_guarantee
        after = 0.0
        drain_s = (
            section.warn_seconds + section.checkpoint_timeout_seconds + section.terminate_timeout_seconds
        )
        if guarantee.enabled and guarantee.drain_at_latest_step:
            after = drain_after_seconds(section.max_total_seconds, drain_s, 60.0 * config.loop.tick_minutes)
        return cls(
            section.under_use_util_pct,
            section.under_use_minutes,
            section.pressure_util_pct,
            min_score,
            float(config.loop.sample_interval_seconds),
            float(config.loop.tick_minutes),
            after,
            section.max_total_seconds - drain_s,
            guarantee.late_drains if guarantee.enabled else "oldest_first",
        )


@dataclass(frozen=True)
class PlanningInputs:
    fleet_now: datetime  # the fleet's clock (a simulated fleet runs ahead of the wall)
    tasks: Sequence[TaskInfo]
    nodes: Sequence[NodeInfo]
    samples: pl.DataFrame
    ledger: DrainLedger
    shadow: bool
    ledger_now: datetime | None = None  # the operator's clock; defaults to fleet_now
    history_by_task: Mapping[str, DrainHistory] = field(default_factory=dict)
    history_by_tenant: Mapping[str, DrainHistory] = field(default_factory=dict)
    scale_down_nodes: Sequence[str] = ()
    manual_task_ids: Sequence[str] = ()
    # tenant -> why: tenants a budget guard blocked, grace period over (drain.budget)
    budget_blocked_tenants: Mapping[str, str] = field(default_factory=dict)
    # guaranteed tasks waiting for capacity (`drain.triggers.GuaranteedWaiting` makes room)
    waiting: Sequence[WaitingTask] = ()


@dataclass(frozen=True)
class DrainDecision:
    decision_id: str
    task: TaskInfo
    reason: DrainReason
    allowed: bool
    shadow: bool
    reasons: tuple[str, ...]  # "code: explanation"; the trigger first, blockers after
    score: DrainabilityScore
    utilisation: UtilisationStats | None
    decided_at: datetime
    fleet_now: datetime

    def inputs(self) -> DrainInputs:
        util = self.utilisation
        return DrainInputs(
            task=task_to_dict(self.task),
            tenant_id=self.task.tenant_id,
            node_id=self.task.node_id,
            trigger=self.reason.value,
            score=self.score.score,
            score_components=self.score.components(),
            util_mean_pct=None if util is None else round(util.mean_pct, 3),
            util_max_pct=None if util is None else round(util.max_pct, 3),
            fleet_now=self.fleet_now,
        )

    def ledger_entry(self) -> LedgerEntry:
        return LedgerEntry(
            self.decision_id,
            self.task.task_id,
            self.task.tenant_id,
            self.task.pool_id,
            self.task.node_id,
            self.decided_at,
        )


def decision_id_for(task: TaskInfo, reason: DrainReason, decided_at: datetime, tick_minutes: float) -> str:
    """Stable within a tick: re-running the planner in the same tick yields the same id."""
    tick = max(int(tick_minutes * 60), 1)
    slot = int(decided_at.timestamp()) // tick * tick
    key = f"{task.task_id}|{task.started_at.isoformat()}|{reason.value}|{slot}"
    return "drain-" + hashlib.blake2s(key.encode(), digest_size=8).hexdigest()


def pool_capacity(nodes: Sequence[NodeInfo]) -> dict[str, tuple[int, float]]:
    """pool -> (nodes on, GPUs on)."""
    out: dict[str, tuple[int, float]] = {}
    for node in nodes:
        if node.state is NodeState.ON:
            count, gpus = out.get(node.pool_id, (0, 0.0))
            out[node.pool_id] = (count + 1, gpus + node.gpus)
    return out


class _Batch:
    """One planning pass (a `drain.triggers.DrainPass`): remembers choices so later
    checks see earlier approvals."""

    def __init__(
        self,
        inputs: PlanningInputs,
        policy: SelectionPolicy,
        limits: DrainLimits,
        scores: Mapping[str, DrainabilityScore],
        util: Mapping[str, UtilisationStats],
        ordered: Sequence[TaskInfo],
    ) -> None:
        self.inputs, self.policy, self.limits = inputs, policy, limits
        self.scores, self.util, self.ordered = scores, util, ordered
        self.running = inputs.tasks
        self.manual_task_ids = inputs.manual_task_ids
        self.budget_blocked_tenants = inputs.budget_blocked_tenants
        self.scale_down_nodes = inputs.scale_down_nodes
        self.nodes, self.waiting, self.fleet_now = inputs.nodes, inputs.waiting, inputs.fleet_now
        self.ledger = DrainLedger(list(inputs.ledger.entries))
        self.ledger_now = inputs.ledger_now or inputs.fleet_now
        self.gpus_on = {pool: gpus for pool, (_, gpus) in pool_capacity(inputs.nodes).items()}
        self.decisions: list[DrainDecision] = []
        self.chosen: set[str] = set()

    def consider(self, task: TaskInfo, reason: DrainReason, trigger: str, budget: DisruptionBudget) -> bool:
        self.chosen.add(task.task_id)
        pool = budget.pool(task.pool_id)
        blockers = self._blockers(task, reason, pool, self.ledger)
        score = self.scores[task.task_id]
        decision = DrainDecision(
            decision_id=decision_id_for(task, reason, self.ledger_now, self.policy.tick_minutes),
            task=task,
            reason=reason,
            allowed=not blockers,
            shadow=self.inputs.shadow,
            reasons=(f"{reason.value}: {trigger}", f"score: {score.score:.2f}", *blockers),
            score=score,
            utilisation=self.util.get(task.task_id),
            decided_at=self.ledger_now,
            fleet_now=self.inputs.fleet_now,
        )
        self.decisions.append(decision)
        if decision.allowed:
            self.ledger.add(decision.ledger_entry())
            pool.consume(task.node_id)
        return decision.allowed

    def blockers_of_all(
        self, tasks: Sequence[TaskInfo], reason: DrainReason, budget: DisruptionBudget
    ) -> list[str]:
        """Why `consider` would block one of `tasks` handed to it in this order (empty: it
        would approve them all), each approval counted against the next, nothing recorded:
        a method that drains all or nothing asks this first."""
        trial = DrainLedger(list(self.ledger.entries))
        trial_pools = {
            pool_id: replace(budget.pool(pool_id), disrupting=set(budget.pool(pool_id).disrupting))
            for pool_id in {t.pool_id for t in tasks}
        }
        for task in tasks:
            pool = trial_pools[task.pool_id]
            found = self._blockers(task, reason, pool, trial)
            if found:
                return found
            trial.add(
                LedgerEntry(
                    decision_id_for(task, reason, self.ledger_now, self.policy.tick_minutes),
                    task.task_id,
                    task.tenant_id,
                    task.pool_id,
                    task.node_id,
                    self.ledger_now,
                )
            )
            pool.consume(task.node_id)
        return []

    def _blockers(
        self, task: TaskInfo, reason: DrainReason, pool: PoolBudget, ledger: DrainLedger
    ) -> list[str]:
        """Every limit on one drain: the task limits against `ledger`, the pool's share of the
        tick's budget, and the drainability score (a drain for pressure must be cheap)."""
        blockers = self.limits.task_blockers(
            task, reason, fleet_now=self.inputs.fleet_now, ledger_now=self.ledger_now, ledger=ledger
        )
        over = pool.blocker(reason, task.node_id)
        blockers.extend([over] if over else [])
        score = self.scores[task.task_id]
        # an operator's or a budget drain is not about how cheap the task is to drain
        if reason not in SCORE_EXEMPT and score.score < self.policy.min_score:
            blockers.append(f"low_score: drainability {score.score:.2f} < {self.policy.min_score:.2f}")
        return blockers


def plan_drains(
    inputs: PlanningInputs,
    policy: SelectionPolicy,
    limits: DrainLimits,
    budget: DisruptionBudget | None = None,
) -> list[DrainDecision]:
    """This tick's drain decisions; each trigger (`DRAIN_METHODS`, in order) consumes from
    `budget`, the tick's one disruption budget (built from the fleet and the ledger if not
    given: pass the scaler's to share it)."""
    ledger_now = inputs.ledger_now or inputs.fleet_now
    busy = inputs.ledger.open_task_ids(ledger_now, limits.decision_ttl_seconds)
    tasks = [t for t in inputs.tasks if t.task_id not in busy]
    window = max(policy.under_use_minutes, policy.sample_interval_seconds / 60.0)
    util = task_utilisation(inputs.samples, tasks, inputs.fleet_now, window)
    scores = {
        t.task_id: drainability_score(
            t, util.get(t.task_id), history_for(t, inputs.history_by_task, inputs.history_by_tenant)
        )
        for t in tasks
    }
    if budget is None:
        budget = limits.tick_budget(inputs.nodes, inputs.tasks, inputs.ledger, ledger_now)
    batch = _Batch(inputs, policy, limits, scores, util, candidate_order(tasks, scores))
    run_methods(DRAIN_METHODS, batch, budget)
    return batch.decisions


def node_is_drained(node_id: str, running: Sequence[TaskInfo]) -> tuple[bool, list[str]]:
    """Whether a node may be released or powered off: no task runs on it any more."""
    left = sorted(t.task_id for t in running if t.node_id == node_id)
    return not left, left


def decisions_frame(decisions: Sequence[DrainDecision]) -> pl.DataFrame:
    """Rows for the warehouse `decisions` table (kind = 'drain')."""
    return warehouse_decisions_frame(
        DecisionRow(
            decision_id=d.decision_id,
            kind=DecisionKind.DRAIN,
            action=DecisionAction.DRAIN_TASK,
            decided_at=d.decided_at,
            allowed=d.allowed,
            shadow=d.shadow,
            pool_id=d.task.pool_id,
            target=d.task.task_id,
            reasons=tuple(d.reasons),
            inputs=d.inputs(),
        )
        for d in decisions
    )
