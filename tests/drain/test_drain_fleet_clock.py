"""On a fleet that keeps its own time, a drain's waiting moves that time, not the wall's."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from market_pipeline.config import load_config
from market_pipeline.drain.calls import AdvancingClock, SystemClock, clock_for
from market_pipeline.fleet.twin_adapter import SimulatedAdapter

EPOCH = datetime(2026, 1, 5, tzinfo=UTC)


def test_simulated_fleet_gets_an_advancing_clock_that_never_sleeps(tmp_path: Path, monkeypatch):
    adapter = SimulatedAdapter(load_config(), tmp_path / "fleet.json", epoch=EPOCH)
    adapter.advance(EPOCH + timedelta(hours=1))
    clock = clock_for(adapter)
    assert isinstance(clock, AdvancingClock)

    def no_wall_sleep(seconds):
        raise AssertionError(f"slept {seconds}s on the wall clock")

    monkeypatch.setattr(time, "sleep", no_wall_sleep)
    before, fleet_before = clock.now(), adapter.now()
    clock.sleep(90.0)
    assert adapter.now() - fleet_before == timedelta(seconds=90)
    assert clock.now() - before >= timedelta(seconds=90)
    clock.sleep(0.0)  # nothing to wait: the fleet stays put
    assert adapter.now() - fleet_before == timedelta(seconds=90)


def test_other_fleets_keep_the_system_clock():
    class RealFleet:
        def now(self) -> datetime:
            return datetime.now(UTC)

    assert isinstance(clock_for(RealFleet()), SystemClock)
    assert isinstance(clock_for(object()), SystemClock)


def test_drain_on_the_simulated_fleet_completes_on_fleet_time(tmp_path: Path, monkeypatch):
    from market_pipeline.drain.calls import InlineStepCaller
    from market_pipeline.drain.executor import DrainExecutor, DrainRequest
    from market_pipeline.drain.protocol import InMemoryAuditStore
    from market_pipeline.drain.steps import DrainTiming

    config = load_config()
    adapter = SimulatedAdapter(config, tmp_path / "fleet.json", epoch=EPOCH)
    adapter.advance(EPOCH + timedelta(hours=1))
    task = next(t for t in adapter.list_tasks() if not t.do_not_drain and not t.checkpointable)
    monkeypatch.setattr(time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("wall sleep")))
    fleet_before = adapter.now()
    clock = clock_for(adapter)
    executor = DrainExecutor(
        adapter,
        InMemoryAuditStore(),
        DrainTiming.from_config(config),
        clock=clock,
        caller=InlineStepCaller(clock),
    )
    report = executor.run(DrainRequest(drain_id="d1", task=task, reasons=("test",), decision_id="d1"))
    assert report.terminal
    assert task.task_id not in {t.task_id for t in adapter.list_tasks()}
    assert adapter.now() > fleet_before  # the notice passed on the fleet's clock


def test_a_drain_moves_the_simulated_fleet_the_same_however_long_its_calls_take(tmp_path: Path):
    """The fleet's time a drain takes is its waits, never the wall time its adapter calls
    happen to take: the same drain from the same fleet ends the task at the same moment
    (the demo billed one metered second more or less from run to run when it did not)."""
    from dataclasses import replace

    from market_pipeline.drain.executor import DrainExecutor, DrainRequest
    from market_pipeline.drain.protocol import InMemoryAuditStore
    from market_pipeline.drain.steps import DrainTiming

    config = load_config()
    timing = replace(DrainTiming.from_config(config), poll_seconds=2.0)

    def drain(path: Path, call_wall_seconds: float) -> tuple[datetime, str]:
        adapter = SimulatedAdapter(config, path, epoch=EPOCH)
        adapter.advance(EPOCH + timedelta(hours=1))
        task = next(
            t
            for t in sorted(adapter.list_tasks(), key=lambda t: t.task_id)
            if not t.do_not_drain and not t.checkpointable
        )
        listing = adapter.list_tasks

        def slow_listing():
            time.sleep(call_wall_seconds)  # a busy adapter: wall time passes, the fleet's does not
            return listing()

        adapter.list_tasks = slow_listing  # type: ignore[method-assign]
        report = DrainExecutor(adapter, InMemoryAuditStore(), timing, clock=clock_for(adapter)).run(
            DrainRequest(drain_id="d1", task=task, reasons=("test",), decision_id="d1")
        )
        assert report.terminal
        return adapter.now(), report.outcome

    quick = drain(tmp_path / "quick.json", 0.0)
    busy = drain(tmp_path / "busy.json", 0.2)
    assert busy == quick
