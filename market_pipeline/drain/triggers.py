"""The drain planner's triggers: one disruption method per reason (`disruption_budget`).

Run in this order, most urgent first: pool pressure, operator requests, the billing budget
guard, the scaler's scale-down, under-use. Each method walks its own candidates (the tasks
in the planner's order, lowest priority and most drainable first) and hands each triggered
task to the pass, which decides it against the task limits and the tick's one budget; an
approval consumes from that budget before the next candidate, of this method or a later one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from market_pipeline.disruption.budget import DisruptionBudget, DisruptionMethod, DisruptionReason
from market_pipeline.drain.score import UtilisationStats, is_under_used
from market_pipeline.hardware.protocol import TaskInfo


class DrainPolicy(Protocol):
    @property
    def pressure_util_pct(self) -> float: ...
    @property
    def under_use_util_pct(self) -> float: ...
    @property
    def under_use_minutes(self) -> float: ...
    @property
    def sample_interval_seconds(self) -> float: ...


class DrainPass(Protocol):
    """What the methods read of one planning pass, and how they hand a task to it."""

    @property
    def policy(self) -> DrainPolicy: ...
    @property
    def ordered(self) -> Sequence[TaskInfo]: ...  # every drainable task, in the planner's order
    @property
    def running(self) -> Sequence[TaskInfo]: ...  # every running task (they all hold capacity)
    @property
    def util(self) -> Mapping[str, UtilisationStats]: ...
    @property
    def chosen(self) -> set[str]: ...  # tasks some method already considered this pass
    @property
    def gpus_on(self) -> Mapping[str, float]: ...  # pool -> GPUs of the nodes on
    @property
    def manual_task_ids(self) -> Sequence[str]: ...
    @property
    def budget_blocked_tenants(self) -> Mapping[str, str]: ...
    @property
    def scale_down_nodes(self) -> Sequence[str]: ...

    def consider(
        self, task: TaskInfo, reason: DisruptionReason, trigger: str, budget: DisruptionBudget
    ) -> bool: ...


@dataclass(frozen=True)
class Pressure:
    """Free GPUs in a pool whose allocation is above the threshold until it is back under."""

    reason: DisruptionReason = DisruptionReason.PRESSURE

    def compute(self, plan: DrainPass, budget: DisruptionBudget) -> None:
        allocated: dict[str, float] = {}
        for task in plan.running:  # every running task holds capacity, drained or not
            allocated[task.pool_id] = allocated.get(task.pool_id, 0.0) + task.gpus
        threshold = plan.policy.pressure_util_pct / 100.0
        for pool_id in sorted(allocated):
            capacity = plan.gpus_on.get(pool_id, 0.0)
            if capacity <= 0 or allocated[pool_id] / capacity <= threshold:
                continue
            need = allocated[pool_id] - threshold * capacity
            freed = 0.0
            trigger = (
                f"pool {pool_id} allocation {allocated[pool_id] / capacity:.0%} "
                f"> {plan.policy.pressure_util_pct:g}%"
            )
            for task in (t for t in plan.ordered if t.pool_id == pool_id):
                if freed >= need:
                    break
                if plan.consider(task, self.reason, trigger, budget):
                    freed += task.gpus


@dataclass(frozen=True)
class Manual:
    """The tasks an operator asked to drain, in the order asked."""

    reason: DisruptionReason = DisruptionReason.MANUAL

    def compute(self, plan: DrainPass, budget: DisruptionBudget) -> None:
        for task_id in plan.manual_task_ids:
            for task in (t for t in plan.ordered if t.task_id == task_id and t.task_id not in plan.chosen):
                plan.consider(task, self.reason, "operator request", budget)


@dataclass(frozen=True)
class BudgetGuard:
    """Every running task of a tenant the billing budget guard blocked (grace period over)."""

    reason: DisruptionReason = DisruptionReason.BUDGET

    def compute(self, plan: DrainPass, budget: DisruptionBudget) -> None:
        for task in plan.ordered:
            why = plan.budget_blocked_tenants.get(task.tenant_id)
            if why is not None and task.task_id not in plan.chosen:
                plan.consider(task, self.reason, why, budget)


@dataclass(frozen=True)
class ScaleDown:
    """The tasks on the nodes the scaler wants empty."""

    reason: DisruptionReason = DisruptionReason.SCALE_DOWN

    def compute(self, plan: DrainPass, budget: DisruptionBudget) -> None:
        for node_id in plan.scale_down_nodes:
            for task in (t for t in plan.ordered if t.node_id == node_id and t.task_id not in plan.chosen):
                plan.consider(task, self.reason, f"scaler empties node {node_id}", budget)


@dataclass(frozen=True)
class UnderUsed:
    """A task below the utilisation threshold for the whole window."""

    reason: DisruptionReason = DisruptionReason.UNDER_USED

    def compute(self, plan: DrainPass, budget: DisruptionBudget) -> None:
        policy = plan.policy
        for task in plan.ordered:
            stats = plan.util.get(task.task_id)
            if (
                stats is not None
                and task.task_id not in plan.chosen
                and is_under_used(
                    stats, policy.under_use_util_pct, policy.under_use_minutes, policy.sample_interval_seconds
                )
            ):
                plan.consider(
                    task,
                    self.reason,
                    f"peak util {stats.max_pct:.1f}% of request < "
                    f"{policy.under_use_util_pct:g}% for {policy.under_use_minutes:g} min",
                    budget,
                )


DRAIN_METHODS: tuple[DisruptionMethod[DrainPass], ...] = (
    Pressure(),
    Manual(),
    BudgetGuard(),
    ScaleDown(),
    UnderUsed(),
)
