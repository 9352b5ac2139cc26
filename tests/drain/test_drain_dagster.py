"""Dagster wiring: drain_requests -> drain_sensor (run_key = batch id) -> drain_job."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest
from drain_testkit import make_task

from assets.drains.assets import drain_requests
from assets.drains.jobs import drain_job, drain_run_config
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.lib.tags import TICK_TAG
from market_pipeline.action_batches import batch_id_for, batch_rows, carry_out, result_for
from market_pipeline.config import load_config
from market_pipeline.drain.limits import DrainReason
from market_pipeline.drain.plan import DrainDecision
from market_pipeline.drain.score import drainability_score
from market_pipeline.drain.store import write_decisions
from market_pipeline.hardware.local_process.adapter import LocalProcessAdapter, WorkerOptions
from market_pipeline.hardware.protocol import adapter_now
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.decisions import DecisionKind
from sensors.drain import drain_sensor

try:  # the lazy backend factory lives in hardware/__init__.py (another concern)
    from market_pipeline.hardware import make_adapter  # noqa: F401

    FleetResource = FleetAdapterResource
except ImportError:

    class FleetResource(FleetAdapterResource):  # type: ignore[no-redef]
        def get(self):
            return LocalProcessAdapter.from_config(self.config())


@pytest.fixture(scope="module")
def instance():
    """One in-memory Dagster instance for the module (each new one costs seconds of CPU)."""
    return dg.DagsterInstance.ephemeral()


@pytest.fixture
def local_config(tmp_path, monkeypatch):
    settings = {
        "ADAPTER__BACKEND": "local-process",
        "ADAPTER__STATE_PATH": str(tmp_path / "fleet.json"),
        "ADAPTER__OPERATION_TIMEOUT_SECONDS": "3",
        "WAREHOUSE__PATH": str(tmp_path / "w.duckdb"),
        "LOOP__SAMPLE_INTERVAL_SECONDS": "1",
        "GUARDRAILS__TASK_DRAIN__UNDER_USE_MINUTES": "0.02",
        "GUARDRAILS__TASK_DRAIN__LANDING_COOLDOWN_MINUTES": "0",
        "GUARDRAILS__TASK_DRAIN__WARN_SECONDS": "0.5",
        "GUARDRAILS__TASK_DRAIN__CHECKPOINT_TIMEOUT_SECONDS": "1",
        "GUARDRAILS__TASK_DRAIN__TERMINATE_TIMEOUT_SECONDS": "1",
        "GUARDRAILS__TASK_DRAIN__MAX_TOTAL_SECONDS": "10",
    }
    for key, value in settings.items():
        monkeypatch.setenv(f"MP__{key}", value)
    return load_config()


def resources(config):
    return {"warehouse": WarehouseResource(path=str(config.warehouse_path)), "fleet": FleetResource()}


def decision(task_id: str, *, allowed=True, shadow=False, at: datetime | None = None) -> DrainDecision:
    task = make_task(task_id)
    now = at or datetime.now(timezone.utc)
    return DrainDecision(
        decision_id=f"drain-{task_id}",
        task=task,
        reason=DrainReason.UNDER_USED,
        allowed=allowed,
        shadow=shadow,
        reasons=("under_used: test",),
        score=drainability_score(task, None, None),
        utilisation=None,
        decided_at=now,
        fleet_now=now,
    )


def test_drain_sensor_launches_one_run_per_tick_and_has_no_side_effect(tmp_path, instance):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    tick, later = (
        datetime(2026, 1, 5, 10, tzinfo=timezone.utc),
        datetime(2026, 1, 5, 10, 5, tzinfo=timezone.utc),
    )
    write_decisions(
        warehouse,
        [
            decision("a", at=tick),
            decision("b", at=tick),
            decision("c", at=later),
            decision("blocked", allowed=False, at=tick),
            decision("shadow", shadow=True, at=tick),
        ],
    )
    before = warehouse.query("SELECT * FROM decisions ORDER BY decision_id")
    context = dg.build_sensor_context(
        instance=instance, resources={"warehouse": WarehouseResource(path=str(warehouse.path))}
    )
    first = drain_sensor.evaluate_tick(context).run_requests
    second = drain_sensor.evaluate_tick(context).run_requests
    batch = batch_id_for(DecisionKind.DRAIN, tick)
    assert (
        [r.run_key for r in first]
        == [r.run_key for r in second]
        == [batch, batch_id_for(DecisionKind.DRAIN, later)]
    )
    assert first[0].tags["drain/batch_id"] == batch and first[0].tags["drain/decisions"] == "2"
    assert first[0].tags["drain/tick"] == tick.isoformat()
    assert first[0].tags[TICK_TAG] == tick.isoformat()  # the tag every loop run carries: joins to its tick
    assert warehouse.query("SELECT * FROM decisions ORDER BY decision_id").equals(before)
    warehouse.execute(
        "UPDATE decisions SET executed_at = now(), outcome = 'terminated' "
        "WHERE decision_id IN ('drain-a', 'drain-c')"
    )
    context = dg.build_sensor_context(
        instance=instance, resources={"warehouse": WarehouseResource(path=str(warehouse.path))}
    )
    assert [r.run_key for r in drain_sensor.evaluate_tick(context).run_requests] == [batch]
    # A run that died before finishing its drains gets a resume run, not a silent stall.
    failed = drain_job.execute_in_process(
        run_config=drain_run_config(tick),
        instance=instance,
        raise_on_error=False,
        tags={"drain/batch_id": batch},
        resources={
            "warehouse": WarehouseResource(path=str(warehouse.path)),
            "fleet": FleetAdapterResource(config_path=str(tmp_path / "missing.toml")),
        },
    )
    assert not failed.success
    [resume] = drain_sensor.evaluate_tick(context).run_requests
    assert resume.run_key == f"{batch}#resume1" and resume.tags["drain/batch_id"] == batch


def test_a_drain_whose_run_died_is_taken_over_and_one_in_flight_is_left(tmp_path):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    tick = datetime(2026, 1, 5, 10, tzinfo=timezone.utc)
    write_decisions(warehouse, [decision(t, at=tick) for t in ("a", "b", "c")])
    warehouse.execute("UPDATE decisions SET claimed_by = 'dead' WHERE decision_id = 'drain-a'")
    warehouse.execute("UPDATE decisions SET claimed_by = 'live' WHERE decision_id = 'drain-b'")
    acted = []

    def act(row):
        acted.append(row["decision_id"])
        return result_for(row, "ok", "terminated")

    def run(run_id):
        return carry_out(
            warehouse,
            batch_rows(warehouse, DecisionKind.DRAIN, tick),
            batch_id=batch_id_for(DecisionKind.DRAIN, tick),
            run_id=run_id,
            now=tick,
            run_is_live=lambda r: r == "live",
            resumable=True,
            act=act,
            record=False,
        )

    assert [r.status for r in run("r1")] == ["ok", "skipped", "ok"]
    assert acted == ["drain-a", "drain-c"]  # the drain protocol resumes a from its audit log
    claims = dict(warehouse.query("SELECT decision_id, claimed_by FROM decisions").iter_rows())
    assert claims == {"drain-a": "r1", "drain-b": "live", "drain-c": "r1"}
    # The stand-in drains recorded no outcome (as a drain stopped half-way): the next run
    # finds r1's claims, r1 is not live, so it takes them over and resumes them.
    assert [r.status for r in run("r2")] == ["ok", "skipped", "ok"]


def test_drain_sensor_skips_without_a_warehouse(tmp_path, instance):
    context = dg.build_sensor_context(
        instance=instance, resources={"warehouse": WarehouseResource(path=str(tmp_path / "none.duckdb"))}
    )
    result = drain_sensor.evaluate_tick(context)
    assert result.run_requests == [] and result.skip_message


def test_drain_end_to_end_under_used_worker(local_config, instance):
    adapter = LocalProcessAdapter.from_config(local_config)
    worker = adapter.launch_task(
        task_id="idle", tenant_id="acme-research", options=WorkerOptions(util_pct=3, metrics_seconds=0.2)
    )
    busy = adapter.launch_task(
        task_id="busy", tenant_id="ember-ai", options=WorkerOptions(util_pct=95, metrics_seconds=0.2)
    )
    try:
        # a few utilisation samples of each (waited for, not slept: on busy shared cores the
        # workers' first samples came later than a fixed second, and no drain was decided)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = datetime.now(timezone.utc)
            seen = adapter.read_samples(now - timedelta(minutes=1), now + timedelta(minutes=1))
            counts = seen["task_id"].value_counts() if seen.height else None
            if counts is not None and counts.height >= 2 and counts["count"].min() >= 5:
                break
            time.sleep(0.2)
        res = resources(local_config)
        result = dg.materialize([drain_requests], resources=res, instance=instance)
        assert result.success
        meta = result.asset_materializations_for_node("drain_requests")[0].metadata
        assert meta["approved"].value == 1 and meta["samples_from"].value == "adapter"
        context = dg.build_sensor_context(instance=instance, resources=res)
        [request] = drain_sensor.evaluate_tick(context).run_requests
        warehouse = res["warehouse"].get()
        row = warehouse.query("SELECT decision_id, target, reasons, decided_at FROM decisions").to_dicts()[0]
        assert (
            request.run_key == batch_id_for(DecisionKind.DRAIN, row["decided_at"]) and row["target"] == "idle"
        )
        # the batch carries the tick (the fleet's clock on the tick grid), not the wall clock
        tick_seconds = local_config.loop.tick_minutes * 60
        assert row["decided_at"].timestamp() % tick_seconds == 0
        assert (
            row["decided_at"]
            <= adapter_now(adapter)
            < row["decided_at"] + timedelta(seconds=2 * tick_seconds)
        )
        assert row["reasons"][0].startswith("under_used")
        run = drain_job.execute_in_process(
            run_config=request.run_config, resources=res, instance=instance, tags=request.tags
        )
        assert run.success
        assert _counts(run) == {"ok": 1}
        executed = warehouse.query("SELECT outcome, executed_at, claimed_by FROM decisions").to_dicts()[0]
        assert executed["outcome"] == "terminated" and executed["executed_at"] is not None
        assert executed["claimed_by"] == run.run_id
        assert [t.task_id for t in adapter.list_tasks()] == ["busy"]
        assert (adapter.workdir / "idle" / "checkpoint.json").exists()
        rows = warehouse.query("SELECT count(*) AS n FROM drain_audit")["n"][0]
        # A repeated run of the same batch drains nothing and writes nothing.
        again = drain_job.execute_in_process(
            run_config=drain_run_config(row["decided_at"]), resources=res, instance=instance
        )
        assert again.success and _counts(again) == {"skipped": 1}
        assert warehouse.query("SELECT count(*) AS n FROM drain_audit")["n"][0] == rows
        billing = warehouse.query(
            "SELECT outcome, platform_fault, grace_seconds FROM drain_billing_events"
        ).to_dicts()
        assert billing == [
            {
                "outcome": "terminated",
                "platform_fault": False,
                "grace_seconds": float(local_config.billing.grace_seconds),
            }
        ]
        context = dg.build_sensor_context(instance=instance, resources=res)
        assert drain_sensor.evaluate_tick(context).run_requests == []
    finally:
        for task in (worker, busy):
            adapter.kill_task(task.task_id)


def _counts(run: dg.ExecuteInProcessResult) -> dict[str, int]:
    [event] = [e for e in run.all_node_events if e.is_successful_output]
    return event.step_output_data.metadata["counts_by_outcome"].value


def test_a_failed_drain_fails_the_run_that_carried_it_out_with_its_reason(tmp_path, instance, monkeypatch):
    """A drain whose protocol ended `failed` (here: the GPU never released) is not an `ok` in a
    green run: its batch run records every outcome, then fails naming the drain and why."""
    from market_pipeline.drain import batches
    from market_pipeline.drain.protocol import DrainState
    from market_pipeline.drain.steps import DrainReport

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    tick = datetime(2026, 1, 5, 10, tzinfo=timezone.utc)
    write_decisions(warehouse, [decision("stuck", at=tick), decision("fine", at=tick)])
    why = "not_released: GPU-0 still in use past release_timeout_seconds=20"

    def execute(store, adapter, config, decision_id):  # the protocol's report, as a fleet gives it
        failed = decision_id == "drain-stuck"
        report = DrainReport(
            decision_id, decision_id.removeprefix("drain-"), "t1", DrainState.REPORTED,
            "failed" if failed else "terminated", why if failed else "", 1.0, ("requested", "reported"),
            tick, tick, None, failed, decision_id,
        )  # fmt: skip
        store.execute(
            "UPDATE decisions SET executed_at = ?, outcome = ? WHERE decision_id = ?",
            [tick, report.outcome, decision_id],
        )
        return report

    monkeypatch.setattr(batches, "execute_decision", execute)
    monkeypatch.setattr(batches, "requeue_drained", lambda *a: _NoRequeue())
    run = drain_job.execute_in_process(
        run_config=drain_run_config(tick),
        instance=instance,
        raise_on_error=False,
        resources={"warehouse": WarehouseResource(path=str(warehouse.path)), "fleet": FleetAdapterResource()},
    )
    assert not run.success
    [failure] = [e for e in run.all_node_events if e.is_failure]
    message = failure.step_failure_data.user_failure_data.description
    assert "1 of 2 actions did not complete" in message and "first: drain-stuck: failed: " in message
    assert why in message
    outcomes = {r["decision_id"]: r["outcome"] for r in warehouse.query("SELECT * FROM decisions").to_dicts()}
    assert outcomes == {"drain-stuck": "failed", "drain-fine": "terminated"}


class _NoRequeue:
    status = type("S", (), {"value": "unsupported"})()
    detail = "the test's fleet requeues nothing"
