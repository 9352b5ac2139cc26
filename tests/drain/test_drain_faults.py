"""Fault injection: 1,000 seeded random fleets, three control-loop ticks each.

Each tick plans drains with the real policy, lets a sensor tick once or twice (run_key
dedupe, sometimes bypassed as a job retry would), executes every request through the real
executor against a fake fleet that times out, raises, fails, loses nodes and crashes the
run before and after acting, and resumes every crashed drain from its audit log.
Invariants: every drain ends terminal; no step's signal is delivered twice within a drain;
drains of one task never overlap; protected tasks are never signalled; a released GPU is
really free; a node is only powered off once every task on it has been drained; caps and
budgets hold; no drain outlives its hard bound (plus its final kill and verification).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl
from drain_testkit import (
    BEHAVIOURS,
    CALL_MARGIN,
    HANG_OVERSHOOT,
    T0,
    CrashingStore,
    FakeClock,
    FakeFleetAdapter,
    FaultPlan,
    SimulatedCrash,
    make_task,
    node,
)

from market_pipeline.disruption.budget import BudgetRule
from market_pipeline.drain.calls import InlineStepCaller
from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.limits import (
    TENANT_CAP_WINDOW,
    DrainLedger,
    DrainLimits,
    LedgerEntry,
)
from market_pipeline.drain.plan import (
    DrainDecision,
    PlanningInputs,
    SelectionPolicy,
    plan_drains,
)
from market_pipeline.drain.protocol import (
    SIDE_EFFECT_STATES,
    TERMINAL_STATES,
    DrainState,
    Phase,
)
from market_pipeline.drain.steps import DrainTiming
from market_pipeline.hardware.protocol import TaskKind

SCENARIOS = 1000
TICKS = 3
STATE_OF_OP = {
    "warn": DrainState.WARNED,
    "checkpoint": DrainState.CHECKPOINTING,
    "terminate": DrainState.TERMINATING,
    "kill": DrainState.KILLED,
}
SAMPLE_SCHEMA = {"ts": pl.Datetime("us", "UTC"), "sm_util_pct": pl.Float64, "task_id": pl.Utf8}


@dataclass
class DecisionRow:
    decision: DrainDecision
    executed_at: datetime | None = None
    outcome: str | None = None


@dataclass
class Scenario:
    seed: int
    rng: random.Random
    clock: FakeClock
    adapter: FakeFleetAdapter
    store: CrashingStore
    limits: DrainLimits
    policy: SelectionPolicy
    timing: DrainTiming
    log: dict[str, DecisionRow] = field(default_factory=dict)
    launched: set[str] = field(default_factory=set)
    executions: int = 0
    crashes: int = 0


def build(seed: int) -> Scenario:
    rng = random.Random(seed)
    clock = FakeClock()
    pools = ["p1"] if rng.random() < 0.5 else ["p1", "p2"]
    nodes = [
        node(f"{p}-n{i}", pool=p, gpus=rng.choice([2, 4])) for p in pools for i in range(rng.randint(2, 4))
    ]
    tasks = []
    for i in range(rng.randint(3, 8)):
        where = rng.choice(nodes)
        task = make_task(
            f"s{seed}-t{i}",
            tenant=rng.choice("abc"),
            pool=where.pool_id,
            node=where.node_id,
            priority=rng.randint(0, 5),
            kind=rng.choice(list(TaskKind)),
            checkpointable=rng.random() < 0.7,
            do_not_drain=rng.random() < 0.15,
            started_at=T0 - timedelta(minutes=rng.choice([2, 30, 600])),
        )
        tasks.append((task, rng.choice(BEHAVIOURS)))
    faults = FaultPlan(
        exception=rng.choice([0.0, 0.05, 0.15]),
        hang=rng.choice([0.0, 0.05, 0.1]),
        failed=rng.choice([0.0, 0.05, 0.1]),
        node_vanish=rng.choice([0.0, 0.02]),
        crash_before=rng.choice([0.0, 0.05]),
        crash_after=rng.choice([0.0, 0.05]),
    )
    adapter = FakeFleetAdapter(clock, tasks, nodes, rng=rng, faults=faults)
    store = CrashingStore(rng, crash_before=rng.choice([0.0, 0.05]), crash_after=rng.choice([0.0, 0.05]))
    budget = (
        BudgetRule(percent=rng.choice([0.0, 10.0, 34.0, 50.0, 100.0]))
        if rng.random() < 0.7
        else BudgetRule(nodes=rng.randint(0, 2))
    )
    limits = DrainLimits(
        tenant_max_drains_per_day=rng.randint(1, 3),
        landing_cooldown_minutes=10,
        budgets=(budget,),
        decision_ttl_seconds=3600,
    )
    policy = SelectionPolicy(
        under_use_util_pct=20,
        under_use_minutes=5,
        pressure_util_pct=rng.choice([60.0, 92.0]),
        min_score=0.3,
        sample_interval_seconds=60,
        tick_minutes=5,
    )
    timing = DrainTiming(
        warn_seconds=rng.uniform(0.5, 5),
        checkpoint_timeout_seconds=rng.uniform(1, 5),
        terminate_timeout_seconds=rng.uniform(1, 5),
        max_total_seconds=rng.choice([5.0, 20.0, 60.0]),
        kill_timeout_seconds=2,
        verify_timeout_seconds=2,
        release_timeout_seconds=rng.choice([0.0, 1.0, 4.0]),
        release_backoff_initial_seconds=0.2,
        release_backoff_max_seconds=1.0,
        call_margin_seconds=CALL_MARGIN,
        poll_seconds=0.5,
    )
    return Scenario(seed, rng, clock, adapter, store, limits, policy, timing)


def truth_tasks(s: Scenario):
    return [t.info for t in s.adapter.tasks.values() if t.alive and t.info.node_id not in s.adapter.vanished]


def samples(s: Scenario) -> pl.DataFrame:
    rows = []
    for task in truth_tasks(s):
        util = 3.0 if s.rng.random() < 0.5 else 85.0
        for minute in range(7):
            rows.append(
                {
                    "ts": s.clock.now() - timedelta(minutes=minute),
                    "sm_util_pct": util,
                    "task_id": task.task_id,
                }
            )
    return pl.DataFrame(rows, schema=SAMPLE_SCHEMA)


def ledger(s: Scenario) -> DrainLedger:
    return DrainLedger(
        [
            LedgerEntry(
                r.decision.decision_id,
                r.decision.task.task_id,
                r.decision.task.tenant_id,
                r.decision.task.pool_id,
                r.decision.task.node_id,
                r.decision.decided_at,
                r.outcome,
            )
            for r in s.log.values()
            if r.decision.allowed
        ]
    )


def execute(s: Scenario, decision: DrainDecision) -> None:
    request = DrainRequest(
        drain_id=decision.decision_id,
        task=decision.task,
        reasons=decision.reasons,
        decision_id=decision.decision_id,
    )
    for _ in range(500):
        executor = DrainExecutor(
            s.adapter, s.store, s.timing, grace_seconds=10, clock=s.clock, caller=InlineStepCaller(s.clock)
        )
        try:
            report = executor.run(request)
            break
        except SimulatedCrash:
            s.crashes += 1
    else:
        raise AssertionError(f"seed {s.seed}: drain {decision.decision_id} never finished")
    s.executions += 1
    if s.rng.random() < 0.1:
        return  # the run died after the drain, before recording it on the decision
    row = s.log[decision.decision_id]
    if row.executed_at is None:
        row.executed_at, row.outcome = s.clock.now(), report.outcome


def tick(s: Scenario) -> None:
    inputs = PlanningInputs(
        fleet_now=s.clock.now(),
        tasks=truth_tasks(s),
        nodes=s.adapter.list_nodes(),
        samples=samples(s),
        ledger=ledger(s),
        shadow=False,
    )
    decisions = plan_drains(inputs, s.policy, s.limits)
    check_limits(s, decisions, Counter(n.pool_id for n in inputs.nodes))
    for decision in decisions:
        s.log.setdefault(decision.decision_id, DecisionRow(decision))
    requests: list[str] = []
    for _ in range(s.rng.choice([1, 2])):  # the sensor may tick twice before runs start
        requests += [
            d
            for d, r in s.log.items()
            if r.decision.allowed and not r.decision.shadow and r.executed_at is None
        ]
    for run_key in requests:
        if run_key in s.launched and s.rng.random() > 0.1:
            continue  # Dagster dedupes by run_key; 10% of the time a retry slips through
        s.launched.add(run_key)
        execute(s, s.log[run_key].decision)
    power_off_released_nodes(s)
    s.clock.sleep(300)


def power_off_released_nodes(s: Scenario) -> None:
    """The scaler's gate: a node goes off only when every task on it was drained."""
    for node_id in sorted(s.adapter.nodes):
        on_node = [t for t in s.adapter.tasks.values() if t.info.node_id == node_id]
        drained = all(
            any(
                h and h[-1].state is DrainState.REPORTED and any(r.state is DrainState.RELEASED for r in h)
                for h in (
                    s.store.load_states(d)
                    for d in s.launched
                    if s.log[d].decision.task.task_id == t.info.task_id
                )
            )
            for t in on_node
        )
        if on_node and drained and node_id not in s.adapter.vanished:
            s.adapter.power_off(node_id)


def check_limits(s: Scenario, decisions: list[DrainDecision], pool_nodes: Counter) -> None:
    """Recount caps and budgets for this tick's decisions, independently of the planner."""
    new_ids = {d.decision_id for d in decisions}
    prior = [r for r in s.log.values() if r.decision.allowed and r.decision.decision_id not in new_ids]
    batch: list[DrainDecision] = []
    for d in decisions:
        if not d.allowed:
            continue
        assert not d.task.do_not_drain, (s.seed, "protected task approved")
        since = d.decided_at - TENANT_CAP_WINDOW
        used = sum(
            1
            for r in prior
            if r.decision.task.tenant_id == d.task.tenant_id
            and r.decision.decided_at >= since
            and r.outcome != "aborted"
        )
        used += sum(1 for b in batch if b.task.tenant_id == d.task.tenant_id)
        assert used + 1 <= s.limits.tenant_max_drains_per_day, (s.seed, d.decision_id, "tenant cap")
        busy = {
            r.decision.task.node_id
            for r in prior
            if r.outcome is None and r.decision.task.pool_id == d.task.pool_id
        }
        busy |= {b.task.node_id for b in batch if b.task.pool_id == d.task.pool_id}
        allowance = s.limits.pool_allowance(d.reason, pool_nodes[d.task.pool_id], d.decided_at)
        assert allowance is not None
        assert len(busy | {d.task.node_id}) <= allowance, (s.seed, d.decision_id, "pool budget")
        batch.append(d)


def check_invariants(s: Scenario) -> None:
    bound = (
        s.timing.max_total_seconds
        + s.timing.kill_timeout_seconds
        + 2 * (CALL_MARGIN + HANG_OVERSHOOT)
        # release checks until the deadline, then one more that may start right before it
        + s.timing.release_timeout_seconds
        + 2 * (CALL_MARGIN + HANG_OVERSHOOT)
        + s.timing.verify_timeout_seconds
        + 1.0
    )
    spans: dict[str, list[tuple[datetime, datetime, str]]] = {}
    for drain_id in s.launched:
        history = s.store.load_states(drain_id)
        assert history and history[-1].state in TERMINAL_STATES, (s.seed, drain_id, "not terminal")
        first, last = history[0], history[-1]
        assert (last.recorded_at - first.recorded_at).total_seconds() <= bound, (
            s.seed,
            drain_id,
            "drain outlived its bound",
        )
        spans.setdefault(first.task_id, []).append((first.recorded_at, last.recorded_at, drain_id))
        begins = Counter(r.state for r in history if r.phase is Phase.BEGIN)
        for state in SIDE_EFFECT_STATES - {DrainState.KILLED}:
            assert begins[state] <= 1, (s.seed, drain_id, f"{state.value} begun twice")
        for row in history:
            if row.state is DrainState.RELEASED:
                fake = s.adapter.tasks[first.task_id]
                assert not fake.alive and fake.gpu_free_at <= row.recorded_at, (
                    s.seed,
                    drain_id,
                    "released while the task or its GPU was busy",
                )
        assert s.store.inner.billing_events.count(last.detail["billing"]) == 1
    for task_id, windows in spans.items():
        windows.sort()
        for (_, end, a), (start, _, b) in zip(windows, windows[1:]):
            assert end <= start, (s.seed, task_id, f"drains {a} and {b} overlap")
        for op, _ in STATE_OF_OP.items():
            for start, end, drain_id in windows:
                delivered = [
                    t
                    for tid, o, t in s.adapter.delivery_log
                    if tid == task_id and o == op and start <= t <= end
                ]
                assert len(delivered) <= 1, (s.seed, drain_id, f"{op} delivered twice")
    for task_id, fake in s.adapter.tasks.items():
        if fake.info.do_not_drain:
            assert not any(k[0] == task_id for k in s.adapter.delivered), (s.seed, "protected")
    for node_id, _, alive in s.adapter.powered_off:
        assert alive == [], (s.seed, node_id, f"powered off with {alive} running")


def test_drain_fault_injection_1000_seeded_scenarios():
    started = time.monotonic()
    totals = Counter()
    for seed in range(SCENARIOS):
        s = build(seed)
        for _ in range(TICKS):
            tick(s)
        check_invariants(s)
        totals["drains"] += len(s.launched)
        totals["executions"] += s.executions
        totals["crashes"] += s.crashes
        for drain_id in s.launched:
            totals[s.store.load_states(drain_id)[-1].state.value] += 1
    # The scenarios must actually exercise the protocol, its failures and its resumes.
    assert totals["drains"] > 1000 and totals["crashes"] > 200
    assert totals["executions"] > totals["drains"]  # duplicates reached the executor
    assert totals["reported"] > 0 and totals["failed"] > 0 and totals["aborted"] > 0
    assert time.monotonic() - started < 60
