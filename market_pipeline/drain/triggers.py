"""The drain planner's triggers: one disruption method per reason (`disruption_budget`).

Run in this order, most urgent first: room for waiting guaranteed tasks (the rigid guarantee:
a promise, and the only method that drains where the room is needed), pool pressure, operator requests, the billing budget guard, the scaler's scale-down,
under-use. Each method walks its own candidates (the tasks
in the planner's order, lowest priority and most drainable first) and hands each triggered
task to the pass, which decides it against the task limits and the tick's one budget; an
approval consumes from that budget before the next candidate, of this method or a later one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np

from market_pipeline.disruption.budget import DisruptionBudget, DisruptionMethod, DisruptionReason
from market_pipeline.drain.room import MAX_NODES_TRIED, RoomCandidate, room_victims
from market_pipeline.drain.score import UtilisationStats, is_under_used
from market_pipeline.hardware.protocol import NodeInfo, NodeState, ResourceClass, TaskInfo, WaitingTask
from market_pipeline.placement.capacity import MILLI, PodRequest
from market_pipeline.placement.guarantee import drain_due, drain_order

MAX_WAITING = 64  # waiting guaranteed tasks one pass makes room for, in `drain_order`
# waiting guaranteed tasks one pass reads from the fleet, oldest first: enough that the ones
# still in time are seen behind a backlog of late ones (`placement.guarantee.drain_order`)
MAX_WAITING_READ = 2048


class DrainPolicy(Protocol):
    @property
    def pressure_util_pct(self) -> float: ...
    @property
    def under_use_util_pct(self) -> float: ...
    @property
    def under_use_minutes(self) -> float: ...
    @property
    def sample_interval_seconds(self) -> float: ...
    @property
    def guaranteed_drain_after_seconds(self) -> float: ...
    @property
    def guaranteed_in_time_seconds(self) -> float: ...
    @property
    def late_drains(self) -> str: ...


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
    @property
    def nodes(self) -> Sequence[NodeInfo]: ...
    @property
    def waiting(self) -> Sequence[WaitingTask]: ...  # guaranteed tasks waiting for capacity
    @property
    def fleet_now(self) -> datetime: ...

    def consider(
        self, task: TaskInfo, reason: DisruptionReason, trigger: str, budget: DisruptionBudget
    ) -> bool: ...

    def blockers_of_all(
        self, tasks: Sequence[TaskInfo], reason: DisruptionReason, budget: DisruptionBudget
    ) -> list[str]: ...  # why `consider` would block one of them, handed in order; nothing recorded


@dataclass(frozen=True)
class Pressure:
    """Free GPUs in a pool whose allocation is above the threshold until it is back under. A
    task an earlier method considered this pass is not handed to the pass again (one decision
    per task); a drain for a waiting guaranteed task frees nothing here, its room is that
    task's."""

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
            for task in (t for t in plan.ordered if t.pool_id == pool_id and t.task_id not in plan.chosen):
                if freed >= need:
                    break
                if plan.consider(task, self.reason, trigger, budget):
                    freed += task.gpus


@dataclass(frozen=True)
class GuaranteedWaiting:
    """Room for guaranteed tasks waiting for capacity (the rigid guarantee, #46), as the
    simulator makes it (`lab.simulate.drains`): for each due waiting task, in the order
    `placement.guarantee.drain_order` gives (at most `MAX_WAITING`), the ON, uncordoned node of
    its GPU model where draining the fewest GPUs of drainable tasks makes room (`drain.room.room_victims`, the simulator's search). A node's
    victims are handed to the pass only when every one of them would be approved (no partial
    drains); a blocked node gives way to the next cheapest (at most `MAX_NODES_TRIED`). The
    reason is pressure, the simulator's drains' reason, under the same limits and budget.

    What the live fleet does not tell: CPU and memory per node, so the search treats both as
    unconstrained (GPU room only). A task is drained for only once it is due
    (`placement.guarantee.drain_due`: it has waited `policy.guaranteed_drain_after_seconds`, or
    it needs a whole node of its GPU model), as the simulator's control steps do. The free
    milli of a GPU is 1000 less what its running tasks hold; a task with an open drain counts
    as gone (its room is on the way), so a waiting task whose room is being drained already
    waits without a second drain. A task that fits somewhere already needs no drain; the node
    whose room one waiting task takes (free or drained) is not offered to a later one in the
    same pass."""

    reason: DisruptionReason = DisruptionReason.PRESSURE

    def compute(self, plan: DrainPass, budget: DisruptionBudget) -> None:
        largest: dict[str, int] = {}
        for node in plan.nodes:
            largest[node.gpu_model] = max(largest.get(node.gpu_model, 0), int(node.gpus))
        after = plan.policy.guaranteed_drain_after_seconds
        due = sorted(
            (
                w
                for w in plan.waiting
                if drain_due(
                    (plan.fleet_now - w.waiting_since).total_seconds(),
                    w.num_gpu,
                    largest.get(w.gpu_model, 0),
                    after,
                )
            ),
            key=lambda w: (w.waiting_since, w.task_id),
        )
        order = drain_order(
            [(plan.fleet_now - w.waiting_since).total_seconds() for w in due],
            plan.policy.guaranteed_in_time_seconds,
            plan.policy.late_drains,
        )
        waiting = [due[i] for i in order][:MAX_WAITING]
        if not waiting:
            return
        rank = {t.task_id: i for i, t in enumerate(plan.ordered)}
        on_node: dict[str, list[TaskInfo]] = {}
        for task in plan.running:
            on_node.setdefault(task.node_id, []).append(task)
        eligible: dict[str, bool] = {}

        def usable(task: TaskInfo) -> bool:
            """Drainable and allowed now on its own (do-not-drain, cool-down, tenant cap,
            budget, score: the simulator's pre-filter); a node's victims are checked together
            again before any is handed to the pass."""
            if (
                task.task_id in plan.chosen
                or task.task_id not in rank
                or task.resource_class is not ResourceClass.DRAINABLE
            ):
                return False
            if task.task_id not in eligible:
                eligible[task.task_id] = not plan.blockers_of_all([task], self.reason, budget)
            return eligible[task.task_id]

        taken: set[str] = set()
        for want in waiting:
            req = PodRequest(want.num_gpu, want.gpu_milli)
            options = []
            for node in plan.nodes:
                if (
                    node.state is NodeState.ON
                    and not node.cordoned
                    and node.gpu_model == want.gpu_model
                    and node.gpus >= want.num_gpu
                    and node.node_id not in taken
                ):
                    victims = _node_victims(node, on_node.get(node.node_id, []), rank, usable, req)
                    if victims is not None:
                        options.append((sum(v.gpus for v in victims), node.node_id, victims))
            options.sort(key=lambda o: (o[0], o[1]))  # a room free already drains nothing: first
            wait_s = (plan.fleet_now - want.waiting_since).total_seconds()
            for _, node_id, victims in options[:MAX_NODES_TRIED]:
                if plan.blockers_of_all(victims, self.reason, budget):
                    continue
                trigger = (
                    f"guaranteed task {want.task_id} waits {wait_s:.0f} s for "
                    f"{want.num_gpu}x{want.gpu_milli} {want.gpu_model}: room on node {node_id}"
                )
                for victim in victims:
                    plan.consider(victim, self.reason, trigger, budget)
                taken.add(node_id)
                break


def _node_victims(
    node: NodeInfo,
    tasks: Sequence[TaskInfo],
    rank: Mapping[str, int],
    usable: Callable[[TaskInfo], bool],
    req: PodRequest,
) -> tuple[TaskInfo, ...] | None:
    """The usable tasks on `node` to drain for `req`, in the planner's order; `()` when it fits
    already, None when draining them all would not make room. Slots: the GPUs its tasks hold
    (by uuid; a live uuid tells no position), the usable tasks' first in the planner's order
    so that where slots tie the search drains the most drainable first and a multi-GPU task's
    GPUs together; then its remaining GPUs, whole and free. A task with an open drain
    (running, not in the planner's order) holds nothing."""
    candidates = sorted((t for t in tasks if usable(t)), key=lambda t: rank[t.task_id])
    picked = {t.task_id for t in candidates}
    slot_of: dict[str, int] = {}
    for task in [*candidates, *(t for t in tasks if t.task_id not in picked)]:
        for uuid in task.gpu_uuids:
            slot_of.setdefault(uuid, len(slot_of))
    free = np.full(max(node.gpus, len(slot_of)), MILLI, dtype=np.int64)
    for task in tasks:
        if task.task_id in rank:
            for uuid in task.gpu_uuids:
                free[slot_of[uuid]] -= task.gpu_milli
    found = room_victims(
        np.clip(free, 0, MILLI),
        np.ones(free.shape, dtype=bool),
        0,  # CPU and memory: not known per live node, unconstrained (the request asks none)
        0,
        [
            RoomCandidate(i, tuple(slot_of[u] for u in t.gpu_uuids), t.gpu_milli, t.gpus)
            for i, t in enumerate(candidates)
        ],
        req,
    )
    return None if found is None else tuple(candidates[i] for i in found)


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
    GuaranteedWaiting(),
    Pressure(),
    Manual(),
    BudgetGuard(),
    ScaleDown(),
    UnderUsed(),
)
