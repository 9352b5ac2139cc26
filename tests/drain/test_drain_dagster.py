"""Dagster wiring: drain_requests -> drain_sensor (run_key = decision id) -> drain_job."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import dagster as dg
import pytest

from assets.drain import drain_job, drain_requests, drain_run_config
from assets.resources import FleetAdapterResource, WarehouseResource
from drain_testkit import make_task
from market_pipeline.config import load_config
from market_pipeline.guardrails.task_drain_limits import DrainReason
from market_pipeline.guardrails.task_drain_plan import DrainDecision
from market_pipeline.guardrails.task_drain_score import drainability_score
from market_pipeline.guardrails.task_drain_store import write_decisions
from market_pipeline.hardware.local_process import LocalProcessAdapter, WorkerOptions
from market_pipeline.warehouse import open_warehouse
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
        "ADAPTER__BACKEND": "local-process", "ADAPTER__STATE_PATH": str(tmp_path / "fleet.json"),
        "ADAPTER__OPERATION_TIMEOUT_SECONDS": "3", "WAREHOUSE__PATH": str(tmp_path / "w.duckdb"),
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
    return {"warehouse": WarehouseResource(path=str(config.warehouse_path)),
            "fleet": FleetResource()}


def decision(task_id: str, *, allowed=True, shadow=False) -> DrainDecision:
    task = make_task(task_id)
    now = datetime.now(timezone.utc)
    return DrainDecision(decision_id=f"drain-{task_id}", task=task, reason=DrainReason.UNDER_USED,
                         allowed=allowed, shadow=shadow, reasons=("under_used: test",),
                         score=drainability_score(task, None, None), utilisation=None,
                         decided_at=now, fleet_now=now)


def test_drain_sensor_dedupes_by_decision_id_and_has_no_side_effect(tmp_path, instance):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    write_decisions(warehouse, [decision("a"), decision("b"), decision("blocked", allowed=False),
                                decision("shadow", shadow=True)])
    before = warehouse.query("SELECT * FROM decisions ORDER BY decision_id")
    context = dg.build_sensor_context(
        instance=instance, resources={"warehouse": WarehouseResource(path=str(warehouse.path))})
    first = drain_sensor.evaluate_tick(context).run_requests
    second = drain_sensor.evaluate_tick(context).run_requests
    assert [r.run_key for r in first] == [r.run_key for r in second] == ["drain-a", "drain-b"]
    assert all(r.tags["drain/decision_id"] == r.run_key for r in first)
    assert warehouse.query("SELECT * FROM decisions ORDER BY decision_id").equals(before)
    warehouse.execute("UPDATE decisions SET executed_at = now(), outcome = 'terminated' "
                      "WHERE decision_id = 'drain-a'")
    context = dg.build_sensor_context(
        instance=instance, resources={"warehouse": WarehouseResource(path=str(warehouse.path))})
    assert [r.run_key for r in drain_sensor.evaluate_tick(context).run_requests] == ["drain-b"]
    # A run that died before finishing its drain gets a resume run, not a silent stall.
    failed = drain_job.execute_in_process(
        run_config=drain_run_config("drain-b"), instance=instance, raise_on_error=False,
        tags={"drain/decision_id": "drain-b"},
        resources={"warehouse": WarehouseResource(path=str(warehouse.path)),
                   "fleet": FleetAdapterResource(config_path=str(tmp_path / "missing.toml"))})
    assert not failed.success
    [resume] = drain_sensor.evaluate_tick(context).run_requests
    assert resume.run_key == "drain-b#resume1" and resume.tags["drain/decision_id"] == "drain-b"


def test_drain_sensor_skips_without_a_warehouse(tmp_path, instance):
    context = dg.build_sensor_context(
        instance=instance,
        resources={"warehouse": WarehouseResource(path=str(tmp_path / "none.duckdb"))})
    result = drain_sensor.evaluate_tick(context)
    assert result.run_requests == [] and result.skip_message


def test_drain_end_to_end_under_used_worker(local_config, instance):
    adapter = LocalProcessAdapter.from_config(local_config)
    worker = adapter.launch_task(task_id="idle", tenant_id="acme-research",
                                 options=WorkerOptions(util_pct=3, metrics_seconds=0.2))
    busy = adapter.launch_task(task_id="busy", tenant_id="ember-ai",
                               options=WorkerOptions(util_pct=95, metrics_seconds=0.2))
    try:
        time.sleep(1.0)  # a few utilisation samples
        res = resources(local_config)
        result = dg.materialize([drain_requests], resources=res, instance=instance)
        assert result.success
        meta = result.asset_materializations_for_node("drain_requests")[0].metadata
        assert meta["approved"].value == 1 and meta["samples_from"].value == "adapter"
        context = dg.build_sensor_context(instance=instance, resources=res)
        [request] = drain_sensor.evaluate_tick(context).run_requests
        warehouse = res["warehouse"].get()
        row = warehouse.query("SELECT decision_id, target, reasons FROM decisions").to_dicts()[0]
        assert request.run_key == row["decision_id"] and row["target"] == "idle"
        assert row["reasons"][0].startswith("under_used")
        run = drain_job.execute_in_process(run_config=request.run_config, resources=res,
                                           instance=instance)
        assert run.success
        executed = warehouse.query("SELECT outcome, executed_at FROM decisions").to_dicts()[0]
        assert executed["outcome"] == "terminated" and executed["executed_at"] is not None
        assert [t.task_id for t in adapter.list_tasks()] == ["busy"]
        assert (adapter.workdir / "idle" / "checkpoint.json").exists()
        rows = warehouse.query("SELECT count(*) AS n FROM drain_audit")["n"][0]
        # A repeated run of the same decision drains nothing and writes nothing.
        again = drain_job.execute_in_process(run_config=drain_run_config(request.run_key),
                                             resources=res, instance=instance)
        assert again.success
        assert warehouse.query("SELECT count(*) AS n FROM drain_audit")["n"][0] == rows
        billing = warehouse.query("SELECT outcome, platform_fault, grace_seconds "
                                  "FROM drain_billing_events").to_dicts()
        assert billing == [{"outcome": "terminated", "platform_fault": False,
                            "grace_seconds": float(local_config.billing.grace_seconds)}]
        context = dg.build_sensor_context(instance=instance, resources=res)
        assert drain_sensor.evaluate_tick(context).run_requests == []
    finally:
        for task in (worker, busy):
            adapter.kill_task(task.task_id)
