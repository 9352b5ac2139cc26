"""The drain state machine: allowed transitions, step rules, resume without repeating."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from drain_testkit import (
    T0,
    CrashingStore,
    FakeClock,
    FakeFleetAdapter,
    FaultPlan,
    SimulatedCrash,
    assert_nothing_delivered,
    make_task,
    node,
)

from market_pipeline.drain.calls import InlineStepCaller
from market_pipeline.drain.executor import DrainExecutor, DrainRequest
from market_pipeline.drain.protocol import (
    DrainProtocolError,
    DrainState,
    DrainTransition,
    DuplicateStepError,
    InMemoryAuditStore,
    Phase,
    check_transition,
    task_from_dict,
    task_to_dict,
)
from market_pipeline.drain.steps import DrainTiming, Step, next_step
from market_pipeline.hardware.protocol import Outcome, OutcomeStatus

TIMING = DrainTiming(
    warn_seconds=10,
    checkpoint_timeout_seconds=20,
    terminate_timeout_seconds=10,
    max_total_seconds=120,
    kill_timeout_seconds=5,
    verify_timeout_seconds=5,
    call_margin_seconds=5,
)


def row(seq: int, state: DrainState, phase: Phase, **detail) -> DrainTransition:
    return DrainTransition(
        "d1",
        seq,
        state,
        phase,
        T0 + timedelta(seconds=seq),
        "t1",
        "n1",
        "ten",
        {"phase": phase.value, **detail},
    )


def run_drain(adapter, store, clock, task, drain_id="d1"):
    executor = DrainExecutor(
        adapter, store, TIMING, grace_seconds=10, clock=clock, caller=InlineStepCaller(clock)
    )
    return executor.run(DrainRequest(drain_id=drain_id, task=task, decision_id=drain_id))


def fleet(behaviour: str, **task_kw):
    clock = FakeClock()
    task = make_task("t1", **task_kw)
    return clock, task, FakeFleetAdapter(clock, [(task, behaviour)], [node("n1")])


def test_drain_state_machine_rejects_skips_and_repeats():
    history = [row(0, DrainState.REQUESTED, Phase.ONLY)]
    with pytest.raises(DrainProtocolError, match="not a protocol transition"):
        check_transition(history, row(1, DrainState.RELEASED, Phase.ONLY))
    history.append(row(1, DrainState.WARNED, Phase.BEGIN))
    with pytest.raises(DrainProtocolError, match="must end"):
        check_transition(history, row(2, DrainState.CHECKPOINTING, Phase.BEGIN))
    with pytest.raises(DrainProtocolError, match="seq"):
        check_transition(history, row(5, DrainState.WARNED, Phase.END, status="ok"))
    history.append(row(2, DrainState.WARNED, Phase.END, status="ok"))
    with pytest.raises(DrainProtocolError, match="begin/end"):
        check_transition(history, row(3, DrainState.CHECKPOINTING, Phase.ONLY))
    history += [row(3, DrainState.KILLED, Phase.BEGIN), row(4, DrainState.KILLED, Phase.END, status="ok")]
    with pytest.raises(DrainProtocolError, match="undelivered"):
        check_transition(history, row(5, DrainState.KILLED, Phase.BEGIN))
    history += [row(5, DrainState.RELEASED, Phase.ONLY), row(6, DrainState.REPORTED, Phase.ONLY)]
    with pytest.raises(DrainProtocolError, match="terminal"):
        check_transition(history, row(7, DrainState.FAILED, Phase.ONLY))


def test_drain_store_refuses_a_second_writer_of_the_same_step():
    store = InMemoryAuditStore()
    store.append(row(0, DrainState.REQUESTED, Phase.ONLY))
    with pytest.raises(DuplicateStepError):
        store.append(row(0, DrainState.REQUESTED, Phase.ONLY))
    assert store.open_drain_ids("t1") == ["d1"]


def test_drain_next_step_rules():
    base = [row(0, DrainState.REQUESTED, Phase.ONLY)]
    assert next_step(base, T0, TIMING).step is Step.WARN
    assert next_step(base, T0 + timedelta(seconds=500), TIMING).step is Step.KILL
    warned = base + [row(1, DrainState.WARNED, Phase.BEGIN)]
    assert next_step(warned, T0, TIMING).step is Step.CLOSE_INTERRUPTED
    gone = warned + [row(2, DrainState.WARNED, Phase.END, status="gone")]
    assert next_step(gone, T0, TIMING).step is Step.VERIFY
    term = base + [
        row(1, DrainState.TERMINATING, Phase.BEGIN),
        row(2, DrainState.TERMINATING, Phase.END, status="timeout"),
    ]
    assert next_step(term, T0, TIMING).step is Step.KILL
    lost = base + [
        row(1, DrainState.TERMINATING, Phase.BEGIN),
        row(2, DrainState.TERMINATING, Phase.END, status="interrupted", alive_after=False),
    ]
    assert next_step(lost, T0, TIMING).step is Step.VERIFY
    kill_failed = base + [
        row(1, DrainState.KILLED, Phase.BEGIN),
        row(2, DrainState.KILLED, Phase.END, status="failed"),
    ]
    assert next_step(kill_failed, T0, TIMING).step is Step.FAIL


def test_drain_task_snapshot_round_trips():
    task = make_task("t9", do_not_drain=True, checkpointable=False, gpu_milli=250)
    assert task_from_dict(task_to_dict(task)) == task
    with pytest.raises(DrainProtocolError, match="malformed"):
        task_from_dict({"task_id": "x"})


@pytest.mark.parametrize(
    "behaviour, outcome, checkpoint",
    [
        ("cooperative", "terminated", "ok"),
        ("slow_checkpoint", "terminated", "timeout"),
        ("ignores_sigterm", "killed", "ok"),
        ("crashes_mid_drain", "gone", "gone"),
        ("already_gone", "gone", None),
        ("exits_during_notice", "gone", "gone"),
    ],
)
def test_drain_behaviours_reach_their_outcome(behaviour, outcome, checkpoint):
    clock, task, adapter = fleet(behaviour)
    store = InMemoryAuditStore()
    report = run_drain(adapter, store, clock, task)
    assert report.final_state is DrainState.REPORTED
    assert (report.outcome, report.checkpoint) == (outcome, checkpoint)
    assert not adapter.tasks["t1"].alive
    assert report.platform_fault is False
    assert store.billing_events[-1]["outcome"] == outcome
    assert report.seconds <= TIMING.max_total_seconds + 20


def test_drain_without_checkpoint_support_waits_the_notice():
    clock, task, adapter = fleet("cooperative", checkpointable=False)
    report = run_drain(adapter, InMemoryAuditStore(), clock, task)
    assert report.checkpoint == "skipped"
    assert report.outcome == "terminated"
    assert report.seconds >= TIMING.warn_seconds
    assert adapter.delivered[("t1", "checkpoint")] == 0


def test_drain_protected_or_restarted_task_is_aborted_before_any_signal():
    clock, task, adapter = fleet("cooperative", do_not_drain=True)
    store = InMemoryAuditStore()
    report = run_drain(adapter, store, clock, task)
    assert report.outcome == "aborted" and "do_not_drain" in report.reason
    assert_nothing_delivered(adapter)
    # The decision saw an older incarnation of the task: refuse.
    clock, task, adapter = fleet("cooperative")
    stale = make_task("t1", started_at=task.started_at - timedelta(hours=3))
    report = run_drain(adapter, InMemoryAuditStore(), clock, stale)
    assert report.outcome == "aborted" and "task_changed" in report.reason
    assert_nothing_delivered(adapter)


def test_drain_second_drain_of_same_task_is_refused():
    clock, task, adapter = fleet("ignores_sigterm")
    store = InMemoryAuditStore()
    store.append(
        DrainTransition("other", 0, DrainState.REQUESTED, Phase.ONLY, T0, "t1", "n1", "t1", {"phase": "only"})
    )
    report = run_drain(adapter, store, clock, task, drain_id="d2")
    assert report.outcome == "aborted" and "duplicate" in report.reason


def test_drain_kill_failure_is_a_platform_fault():
    clock, task, adapter = fleet("ignores_sigterm")
    adapter.kill_task = lambda task_id: Outcome(OutcomeStatus.FAILED, "EPERM")
    store = InMemoryAuditStore()
    report = run_drain(adapter, store, clock, task)
    assert report.final_state is DrainState.FAILED and "kill_failed" in report.reason
    assert report.platform_fault and store.billing_events[-1]["platform_fault"] is True


def test_drain_hard_bound_kills_when_the_budget_is_spent():
    timing = DrainTiming(
        warn_seconds=50,
        checkpoint_timeout_seconds=50,
        terminate_timeout_seconds=50,
        max_total_seconds=30,
        kill_timeout_seconds=1,
        verify_timeout_seconds=1,
        call_margin_seconds=1,
    )
    clock, task, adapter = fleet("slow_checkpoint")
    executor = DrainExecutor(
        adapter, InMemoryAuditStore(), timing, clock=clock, caller=InlineStepCaller(clock)
    )
    report = executor.run(DrainRequest("d1", task))
    assert report.outcome == "killed"
    assert "terminating" not in report.states  # no SIGTERM wait left: straight to SIGKILL
    assert report.seconds <= 30 + 3


def test_drain_resumes_after_crashes_without_repeating_a_signal():
    for seed in range(40):
        rng = random.Random(seed)
        clock, task, adapter = fleet(rng.choice(["cooperative", "ignores_sigterm", "slow_checkpoint"]))
        adapter.rng = rng
        adapter.faults = FaultPlan(crash_before=0.15, crash_after=0.15)
        store = CrashingStore(rng, crash_before=0.15, crash_after=0.15)
        for _ in range(200):
            try:
                report = run_drain(adapter, store, clock, task)
                break
            except SimulatedCrash:
                continue
        else:
            pytest.fail(f"seed {seed}: drain never finished")
        assert report.terminal
        assert all(adapter.delivered[("t1", op)] <= 1 for op in ("warn", "checkpoint", "terminate", "kill"))
        # A second run of a finished drain touches nothing.
        before = dict(adapter.delivered)
        adapter.faults = FaultPlan()
        store.crash_before = store.crash_after = 0.0
        assert run_drain(adapter, store, clock, task) == report
        assert dict(adapter.delivered) == before
