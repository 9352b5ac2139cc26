"""Task drains against the warehouse and a live adapter: plan a tick, execute a decision.

The Dagster asset, the drain job and the CLI call these; the policy underneath
(`plan_drains`, `DrainExecutor`) is the same one the simulator calls.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from market_pipeline.disruption.budget import DisruptionBudget
from market_pipeline.drain.budget import budget_triggers, load_budget_blocks
from market_pipeline.drain.calls import Clock, StepCaller, clock_for
from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.lease import ControlTaskLease, lease_dir_for
from market_pipeline.drain.limits import DrainLimits
from market_pipeline.drain.plan import (
    DrainDecision,
    PlanningInputs,
    SelectionPolicy,
    plan_drains,
)
from market_pipeline.drain.steps import DrainReport, DrainTiming
from market_pipeline.drain.store import (
    WarehouseAuditStore,
    ledger_window_start,
    load_decision,
    load_history,
    load_ledger,
    mark_decision_executed,
    write_decisions,
)
from market_pipeline.drain.triggers import MAX_WAITING_READ
from market_pipeline.hardware.protocol import NodeAdapter, WaitingTask, adapter_now
from market_pipeline.warehouse import Warehouse, telemetry_store
from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.readers import table_exists

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

TELEMETRY_TABLE = telemetry_store.CLEAN_TABLE


class DrainRefused(ValueError):
    """A decision that must not be executed (blocked or shadow); names it and why."""


def recent_samples(
    warehouse: Warehouse, adapter: NodeAdapter, fleet_now: datetime, minutes: float
) -> tuple[pl.DataFrame, str]:
    """Samples of the last `minutes`: the clean telemetry table when it covers the window,
    else straight from the adapter (telemetry not ingested yet, or stale)."""
    start = fleet_now - timedelta(minutes=minutes)
    # a fleet younger than the window has no samples before its first moment (the twin's epoch)
    epoch_time = getattr(adapter, "epoch_time", None)
    if callable(epoch_time):
        start = max(start, epoch_time())
    if table_exists(warehouse, TELEMETRY_TABLE):
        frame = telemetry_store.utilisation_between(warehouse, start, fleet_now)
        if not frame.is_empty():
            return frame, TELEMETRY_TABLE
    return adapter.read_samples(start, fleet_now + timedelta(microseconds=1)), "adapter"


def gather_planning_inputs(
    warehouse: Warehouse,
    adapter: NodeAdapter,
    config: MarketPipelineConfig,
    *,
    wall_now: datetime,
    scale_down_nodes: Sequence[str] = (),
    manual_task_ids: Sequence[str] = (),
) -> tuple[PlanningInputs, str]:
    """Everything plan_drains needs, and where the samples came from."""
    policy = SelectionPolicy.from_config(config)
    limits = DrainLimits.from_config(config)
    fleet_now = adapter_now(adapter)  # a simulated fleet's clock runs ahead of the wall
    window = (
        max(policy.under_use_minutes, policy.sample_interval_seconds / 60.0)
        + policy.sample_interval_seconds / 60.0
    )
    samples, source = recent_samples(warehouse, adapter, fleet_now, window)
    shadow = bool(config.loop.shadow_mode)
    ledger = load_ledger(warehouse, shadow, ledger_window_start(wall_now, limits.decision_ttl_seconds))
    by_task, by_tenant = load_history(warehouse)
    # budget guards decide on the fleet's clock, so their grace period is checked on it too
    budget = budget_triggers(load_budget_blocks(warehouse, fleet_now, shadow))
    inputs = PlanningInputs(
        fleet_now=fleet_now,
        tasks=adapter.list_tasks(),
        nodes=adapter.list_nodes(),
        samples=samples,
        ledger=ledger,
        shadow=shadow,
        ledger_now=wall_now,
        history_by_task=by_task,
        history_by_tenant=by_tenant,
        scale_down_nodes=tuple(scale_down_nodes),
        manual_task_ids=tuple(manual_task_ids),
        budget_blocked_tenants=budget,
        waiting=waiting_guaranteed(adapter),
    )
    return inputs, source


def waiting_guaranteed(adapter: NodeAdapter) -> tuple[WaitingTask, ...]:
    """The guaranteed tasks waiting for capacity, from a backend with a queue (the twin's and
    Slurm's `waiting_guaranteed`; an optional method: local-process and NVML have no queue)."""
    read = getattr(adapter, "waiting_guaranteed", None)
    return tuple(read(limit=MAX_WAITING_READ)) if callable(read) else ()


def tick_budget(
    warehouse: Warehouse, adapter: NodeAdapter, config: MarketPipelineConfig, *, wall_now: datetime
) -> DisruptionBudget:
    """The tick's one disruption budget from the fleet and the drain ledger: build it once and
    pass it to the scaler (`scaling_live.plan_fleet`) and to `plan_and_record`."""
    limits = DrainLimits.from_config(config)
    ledger = load_ledger(
        warehouse, bool(config.loop.shadow_mode), ledger_window_start(wall_now, limits.decision_ttl_seconds)
    )
    return limits.tick_budget(adapter.list_nodes(), adapter.list_tasks(), ledger, wall_now)


def plan_and_record(
    warehouse: Warehouse,
    adapter: NodeAdapter,
    config: MarketPipelineConfig,
    *,
    wall_now: datetime,
    scale_down_nodes: Sequence[str] = (),
    manual_task_ids: Sequence[str] = (),
    budget: DisruptionBudget | None = None,
) -> tuple[list[DrainDecision], int, str]:
    """Plan this tick's drains and write them to `decisions`; (decisions, new rows, source).
    Without the tick's shared `budget`, one is built from the fleet and the ledger. The ledger
    read, the plan and its write hold the warehouse's `plan:drains` lock (the control
    PostgreSQL's advisory lock on the cluster profile, a file lock beside an embedded DuckDB
    file), so two plans running at once, on two workers or a Dagster run and the CLI, cannot
    both spend one disruption budget: the later one reads the earlier one's decisions."""
    with warehouse.exclusive("plan:drains", PLAN_LOCK_WAIT_S):
        return _plan_and_record(
            warehouse, adapter, config, wall_now, scale_down_nodes, manual_task_ids, budget
        )


PLAN_LOCK_WAIT_S = 300.0  # another worker's plan of the same fleet: wait for it, then read its ledger


def _plan_and_record(
    warehouse: Warehouse,
    adapter: NodeAdapter,
    config: MarketPipelineConfig,
    wall_now: datetime,
    scale_down_nodes: Sequence[str],
    manual_task_ids: Sequence[str],
    budget: DisruptionBudget | None,
) -> tuple[list[DrainDecision], int, str]:
    inputs, source = gather_planning_inputs(
        warehouse,
        adapter,
        config,
        wall_now=wall_now,
        scale_down_nodes=scale_down_nodes,
        manual_task_ids=manual_task_ids,
    )
    decisions = plan_drains(
        inputs, SelectionPolicy.from_config(config), DrainLimits.from_config(config), budget
    )
    return decisions, write_decisions(warehouse, decisions), source


def execute_decision(
    warehouse: Warehouse,
    adapter: NodeAdapter,
    config: MarketPipelineConfig,
    decision_id: str,
    *,
    clock: Clock | None = None,
    caller: StepCaller | None = None,
    lease_dir: Path | None = None,
) -> DrainReport:
    """Carry out one approved drain decision (resuming it if a run stopped half-way).

    Holds the task's drain lease (default: next to the adapter state; on the cluster profile,
    an advisory lock in the control PostgreSQL), so a CLI drain and a Dagster run of the same
    task, on any worker, never both act on it (DrainBusy for the later one)."""
    clock = clock or clock_for(adapter)
    decision = load_decision(warehouse, decision_id)
    if not decision.allowed:
        raise DrainRefused(f"decision {decision_id} is blocked: {list(decision.reasons)}")
    if decision.shadow:
        raise DrainRefused(f"decision {decision_id} was made in shadow mode; it only records")
    store = WarehouseAuditStore(warehouse)
    abort = None
    if not store.load_states(decision_id):
        # a decision ages on the clock it was decided on: the fleet's (a simulated twin keeps
        # its own time; the drain clock's timestamps stay on the wall clock)
        ttl = DrainLimits.from_config(config).decision_ttl_seconds
        age = (adapter_now(adapter) - decision.decided_at).total_seconds()
        if age > ttl:
            abort = f"expired: decided {age:.0f}s ago, past the {ttl:.0f}s time-to-live"
    executor = DrainExecutor(
        adapter,
        store,
        DrainTiming.from_config(config),
        grace_seconds=float(config.billing.grace_seconds),
        clock=clock,
        caller=caller,
        lease_dir=lease_dir or lease_dir_for(config),
        leases=_control_leases(warehouse.control)
        if warehouse.control is not None and lease_dir is None
        else None,
    )
    report = executor.run(
        DrainRequest(
            drain_id=decision_id,
            task=decision.task,
            reasons=decision.reasons,
            decision_id=decision_id,
            abort_reason=abort,
        )
    )
    if report.terminal:
        mark_decision_executed(warehouse, report, clock.now())
    return report


# -- operator views ------------------------------------------------------------------------


def _control_leases(control: ControlStore) -> Callable[[str], ControlTaskLease]:
    return lambda task_id: ControlTaskLease(control, task_id)


def decision_rows(decisions: Sequence[DrainDecision]) -> list[dict[str, Any]]:
    """One row per drain decision, for the operator's table: the blockers, else the trigger."""
    return [
        {
            "decision": d.decision_id,
            "task": d.task.task_id,
            "tenant": d.task.tenant_id,
            "node": d.task.node_id,
            "trigger": d.reason.value,
            "allowed": d.allowed,
            "score": round(d.score.score, 2),
            "reasons": "; ".join(d.reasons[2:]) or d.reasons[0],
        }
        for d in decisions
    ]


def outcome_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts by outcome and drain durations (seconds) of finished drains."""
    rows = list(rows)
    by_outcome: dict[str, int] = {}
    for row in rows:
        by_outcome[row["outcome"]] = by_outcome.get(row["outcome"], 0) + 1
    seconds = sorted(float(r["seconds"]) for r in rows if r["seconds"] is not None)
    summary: dict[str, Any] = {
        "drains": len(rows),
        "by_outcome": by_outcome,
        "platform_faults": sum(1 for r in rows if r["platform_fault"]),
    }
    if seconds:
        summary["seconds_p50"] = round(statistics.median(seconds), 3)
        summary["seconds_p95"] = round(seconds[min(len(seconds) - 1, int(0.95 * len(seconds)))], 3)
        summary["seconds_max"] = round(seconds[-1], 3)
    return summary
