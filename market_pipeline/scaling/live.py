"""The live side of the scaling policy: build its inputs from the fleet and the warehouse,
store its decisions, and carry a tick's batch of approved decisions out through the adapter
(each claimed once, its outcome recorded: `market_pipeline.action_batches`).

The policy itself (`market_pipeline.scaling.policy.plan_pool`) is the one the scaling-eval
replay runs; this module only adapts the live fleet to it.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Sequence
from datetime import datetime

import polars as pl

from market_pipeline.action_batches import (
    ActionBatch,
    ActionResult,
    batch_id_for,
    batch_rows,
    carry_out,
    pending_batches,
    result_for,
)
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.disruption.budget import DisruptionBudget
from market_pipeline.drain.plan import node_is_drained
from market_pipeline.hardware.protocol import (
    NodeAdapter,
    NodeInfo,
    NodeState,
    Outcome,
    OutcomeStatus,
    TaskInfo,
)
from market_pipeline.scaling.policy import plan_pool
from market_pipeline.scaling.settings import scaling_config_from_config
from market_pipeline.scaling.types import DrainStatus, NodeView, PoolState, ScalerMemory, ScalingDecision
from market_pipeline.scaling.types import NodeState as ScalingNodeState
from market_pipeline.warehouse import Warehouse
from market_pipeline.warehouse.decision_inputs import ScaleInputs
from market_pipeline.warehouse.decisions import (
    DecisionAction,
    DecisionKind,
    DecisionOutcome,
    DecisionRow,
    decisions_frame,
)
from market_pipeline.warehouse.readers import latest_decision_at, scaler_memory_of

SCALE_KIND = DecisionKind.SCALE
# The actions scaling_actions_job carries out through the adapter (the rest only record).
NODE_ACTIONS = (
    DecisionAction.POWER_ON,
    DecisionAction.SCALE_UP,
    DecisionAction.POWER_OFF,
    DecisionAction.SCALE_DOWN,
    DecisionAction.CORDON,
    DecisionAction.UNCORDON,
)


def node_view(node: NodeInfo, tasks: Sequence[TaskInfo]) -> NodeView:
    """The policy's view of one node; `tasks` are the node's own (any others are ignored)."""
    if node.state is NodeState.ON:
        state = ScalingNodeState.CORDONED if node.cordoned else ScalingNodeState.ACTIVE
    else:
        state = ScalingNodeState.STANDBY if node.state is NodeState.WARM else ScalingNodeState.OFF
    task_gpus = tuple(t.gpus for t in tasks if t.node_id == node.node_id)
    return NodeView(
        node_id=node.node_id,
        state=state,
        gpus=node.gpus,
        used_gpus=min(float(sum(task_gpus)), float(node.gpus)),
        task_gpus=task_gpus,
    )


def tasks_by_node(tasks: Sequence[TaskInfo]) -> dict[str, list[TaskInfo]]:
    """Tasks grouped by node, once per tick (a fleet of thousands of nodes and tasks)."""
    out: dict[str, list[TaskInfo]] = {}
    for task in tasks:
        out.setdefault(task.node_id, []).append(task)
    return out


def drain_statuses(
    nodes: Sequence[NodeInfo], tasks: Sequence[TaskInfo], drain_failures: dict[str, int]
) -> dict[str, DrainStatus]:
    """The task-drain guardrail's word per node: empty, or blocked by a protected task or by
    drains that keep failing."""
    grouped = tasks_by_node(tasks)
    out = {}
    for node in nodes:
        on_node = grouped.get(node.node_id, [])
        protected = [t.task_id for t in on_node if t.do_not_drain]
        attempts = drain_failures.get(node.node_id, 0)
        reason = (
            f"do-not-drain tasks {protected}"
            if protected
            else (f"{attempts} failed drains" if attempts else "")
        )
        out[node.node_id] = DrainStatus(
            node_id=node.node_id,
            all_tasks_drained_or_migrated=node_is_drained(node.node_id, on_node)[0],
            blocked=bool(protected),
            attempts=attempts,
            reason=reason,
        )
    return out


def load_memory(store: Warehouse, pool_id: str) -> ScalerMemory:
    """The pool's scaler memory as the last tick left it, else a fresh one."""
    stored = scaler_memory_of(store, pool_id)
    return ScalerMemory(pool=pool_id) if stored is None else ScalerMemory.from_dict(stored)


def memory_frame(memories: Sequence[ScalerMemory], at: datetime) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "pool_id": [m.pool for m in memories],
            "memory": [json.dumps(m.to_dict()) for m in memories],
            "updated_at": [at] * len(memories),
        },
        schema_overrides={"updated_at": pl.Datetime("us", "UTC")},
    )


def plan_fleet(
    config: MarketPipelineConfig,
    nodes: Sequence[NodeInfo],
    tasks: Sequence[TaskInfo],
    demand_now: dict[str, tuple[float, float]],
    forecast_q90: dict[str, float],
    prices: dict[str, float],
    memories: dict[str, ScalerMemory],
    drain_failures: dict[str, int],
    now: datetime,
    capacity_targets: dict[str, float] | None = None,
    price_ceilings: dict[str, float] | None = None,
    budget: DisruptionBudget | None = None,
) -> list[ScalingDecision]:
    """One tick of the scaling policy for every configured pool (memories updated in place).

    `prices` are the market tick's equilibrium prices and `capacity_targets` the capacity its
    shield certified there: the plan sizes each pool to at least that; `price_ceilings` the
    most the next tick may publish (a shortfall above it is scaled, not priced); `budget` the
    tick's one disruption budget, shared with the drain planner (`drain.service.tick_budget`)."""
    statuses = drain_statuses(nodes, tasks, drain_failures)
    grouped = tasks_by_node(tasks)
    nodes_of_pool: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        nodes_of_pool.setdefault(node.pool_id, []).append(node)
    targets, ceilings = capacity_targets or {}, price_ceilings or {}
    decisions: list[ScalingDecision] = []
    for pool in config.pools:
        pool_nodes = nodes_of_pool.get(pool.pool_id, [])
        demand, pending = demand_now.get(pool.pool_id, (0.0, 0.0))
        state = PoolState(
            pool=pool.pool_id,
            node_gpus=pool.gpus_per_node,
            max_nodes=pool.max_nodes,
            demand_gpus=demand,
            backlog_gpus=pending,
            gpu_hour_cost=config.gpu_model_by_name[pool.gpu_model].cost_per_gpu_hour,
            certified_gpus=float(targets.get(pool.pool_id, 0.0)),
            price_ceiling=float(ceilings.get(pool.pool_id, math.inf)),
        )
        decisions.extend(
            plan_pool(
                state,
                forecast_q90.get(pool.pool_id, demand),
                prices.get(pool.pool_id, pool.base_price),
                [node_view(n, grouped.get(n.node_id, [])) for n in pool_nodes],
                {n.node_id: statuses[n.node_id] for n in pool_nodes},
                scaling_config_from_config(config, pool.pool_id),
                now,
                memory=memories[pool.pool_id],
                budget=budget,
            )
        )
    return decisions


def decision_rows(decisions: Sequence[ScalingDecision], shadow: bool, decided_at: datetime) -> pl.DataFrame:
    return decisions_frame(
        DecisionRow(
            decision_id=f"scale-{d.decision_id}",
            kind=DecisionKind.SCALE,
            action=d.action,
            decided_at=decided_at,
            allowed=d.allowed,
            shadow=shadow,
            pool_id=d.pool,
            target=d.node_id,
            reasons=(*d.reasons, *(["shadow mode: recorded, not executed"] if shadow else [])),
            inputs=d.inputs.recorded(d.count, d.certificate_margin),
        )
        for d in decisions
    )


def pending_scaling_batches(store: Warehouse) -> list[ActionBatch]:
    """Ticks with approved, live scaling actions not yet executed (what the sensor launches)."""
    return pending_batches(store, SCALE_KIND, NODE_ACTIONS)


def execute_scaling_batch(
    store: Warehouse,
    adapter: NodeAdapter,
    tick: datetime,
    *,
    run_id: str,
    now: datetime,
    run_is_live: Callable[[str], bool],
) -> list[ActionResult]:
    """Carry out a tick's approved scaling actions, each once, recording each outcome.

    A batch whose tick a later plan has already replaced is superseded, not carried out: that
    plan saw the fleet without these actions and re-decided (acting on both would double up).
    """
    rows = batch_rows(store, SCALE_KIND, tick, NODE_ACTIONS)
    latest = latest_decision_at(store, SCALE_KIND)
    superseded = latest is not None and latest > tick
    batch = _ScalingBatch(adapter, superseded=latest if superseded else None)
    held = getattr(adapter, "batch", None)  # an adapter that can hold its writes for the batch
    with held() if held is not None else contextlib.nullcontext(lambda: None) as checkpoint:
        return carry_out(
            store,
            rows,
            batch_id=batch_id_for(SCALE_KIND, tick),
            run_id=run_id,
            now=now,
            run_is_live=run_is_live,
            resumable=False,
            act=batch.act,
            checkpoint=checkpoint,
        )


class _ScalingBatch:
    """One batch's actions against the adapter. The node list is read once per batch (on a
    fleet of thousands of nodes a read costs about as much as an action); nodes an earlier
    action of the batch powered on are not picked again (they stay warm or off until they
    join). Whether a node still runs tasks is read right before it is powered off."""

    def __init__(self, adapter: NodeAdapter, superseded: datetime | None) -> None:
        self.adapter, self.superseded = adapter, superseded
        self.powered_on: set[str] = set()
        self._nodes: list[NodeInfo] | None = None

    def act(self, decision: dict) -> ActionResult:
        if self.superseded is not None:
            status, detail = (
                DecisionOutcome.SUPERSEDED,
                f"the plan of {self.superseded.isoformat()} re-decided",
            )
        else:
            try:
                status, detail = self._apply(decision)
            except Exception as exc:  # an adapter that raises: recorded, and the run fails
                status, detail = DecisionOutcome.ERROR, f"{type(exc).__name__}: {exc}"
        return result_for(decision, status, detail)

    def _apply(self, decision: dict) -> tuple[DecisionOutcome, str]:
        action, node_id = DecisionAction(decision["action"]), decision["target"]
        if action in (DecisionAction.POWER_ON, DecisionAction.SCALE_UP):
            count = ScaleInputs.stored_count(decision["inputs"])
            targets = [node_id] if node_id else self._nodes_to_power_on(decision["pool_id"], count)
            if not targets:
                return (
                    DecisionOutcome.INFEASIBLE,
                    f"no standby or off node left in pool {decision['pool_id']} (asked {count})",
                )
            self.powered_on.update(targets)
            outcomes = [self.adapter.power_on(t) for t in targets]
            bad = [o for o in outcomes if not o.ok]
            if bad:
                return _adapter_status(bad[0]), bad[0].detail
            short = f"; {count - len(targets)} more asked, none left" if len(targets) < count else ""
            return DecisionOutcome.OK, f"powered on {targets}{short}"
        if node_id is None:
            return DecisionOutcome.INFEASIBLE, f"{action} names no node"
        if action in (DecisionAction.POWER_OFF, DecisionAction.SCALE_DOWN):
            drained, left = node_is_drained(node_id, self.adapter.list_tasks())
            if not drained:
                return DecisionOutcome.INFEASIBLE, f"node {node_id} still runs tasks {left}; not powered off"
            outcome = self.adapter.power_off(node_id)
        else:
            outcome = (
                self.adapter.cordon(node_id)
                if action is DecisionAction.CORDON
                else self.adapter.uncordon(node_id)
            )
        return (DecisionOutcome.OK if outcome.ok else _adapter_status(outcome)), outcome.detail

    def _nodes_to_power_on(self, pool_id: str, count: int) -> list[str]:
        """Warm nodes first (they join in about a minute), then cold ones."""
        if self._nodes is None:
            self._nodes = self.adapter.list_nodes()
        nodes = [
            n
            for n in self._nodes
            if n.pool_id == pool_id and n.state is not NodeState.ON and n.node_id not in self.powered_on
        ]
        nodes.sort(key=lambda n: (n.state is not NodeState.WARM, n.node_id))
        return [n.node_id for n in nodes[:count]]


def _adapter_status(outcome: Outcome) -> DecisionOutcome:
    """A node that is gone, or in a state the backend will not act on (down, failed, not
    responding, e.g. while its controller restarts), cannot carry the action: infeasible, an
    outcome with its reason; any other refusal is a failure."""
    return (
        DecisionOutcome.INFEASIBLE
        if outcome.status in (OutcomeStatus.GONE, OutcomeStatus.REFUSED)
        else DecisionOutcome.FAILED
    )
