"""Scaling actions in batches: one run per tick (run_key = batch id), each action claimed and
carried out once, an action the fleet cannot carry out recorded as infeasible."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.scaling.jobs import scaling_actions_job
from market_pipeline.action_batches import batch_id_for, batch_rows, carry_out, result_for
from market_pipeline.config import load_config
from market_pipeline.hardware import make_adapter
from market_pipeline.hardware.protocol import NodeInfo, NodeState, Outcome, OutcomeStatus
from market_pipeline.scaling.live import execute_scaling_batch
from market_pipeline.warehouse import Warehouse, open_warehouse
from market_pipeline.warehouse.decisions import DecisionKind
from sensors.scaling import scaling_sensor

T1 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
T2 = T1 + timedelta(minutes=5)
POOL = "A100-80GB@cn-hangzhou-a"


@pytest.fixture(scope="module")
def instance():
    return dg.DagsterInstance.ephemeral()


@pytest.fixture
def fleet_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MP__ADAPTER__STATE_PATH", str(tmp_path / "fleet.json"))
    monkeypatch.setenv("MP__WAREHOUSE__PATH", str(tmp_path / "w.duckdb"))
    config = load_config()
    return config, open_warehouse(config.warehouse_path)


def add(
    store: Warehouse,
    key: str,
    tick: datetime,
    action: str,
    target: str | None = None,
    *,
    count: int = 1,
    allowed: bool = True,
    shadow: bool = False,
    pool: str = POOL,
) -> str:
    decision_id = f"scale-{key}"
    store.upsert(
        "decisions",
        pl.DataFrame(
            [
                {
                    "decision_id": decision_id,
                    "kind": "scale",
                    "pool_id": pool,
                    "target": target,
                    "action": action,
                    "allowed": allowed,
                    "shadow": shadow,
                    "reasons": ["test"],
                    "inputs": json.dumps({"count": count}),
                    "decided_at": tick,
                }
            ],
            schema_overrides={
                "decided_at": pl.Datetime("us", "UTC"),
                "reasons": pl.List(pl.Utf8),
                "target": pl.Utf8,
            },
        ),
    )
    return decision_id


def decisions(store: Warehouse) -> dict[str, dict]:
    rows = store.query("SELECT decision_id, executed_at, outcome, claimed_by, batch_id FROM decisions")
    return {r["decision_id"]: r for r in rows.iter_rows(named=True)}


def sensor_requests(instance, store: Warehouse) -> list[dg.RunRequest]:
    context = dg.build_sensor_context(
        instance=instance, resources={"warehouse": WarehouseResource(path=str(store.path))}
    )
    return scaling_sensor.evaluate_tick(context).run_requests


def run_batch(instance, store: Warehouse, request: dg.RunRequest, fleet=None) -> dg.ExecuteInProcessResult:
    return scaling_actions_job.execute_in_process(
        run_config=request.run_config,
        instance=instance,
        tags=request.tags,
        raise_on_error=False,
        resources={
            "warehouse": WarehouseResource(path=str(store.path)),
            "fleet": fleet or FleetAdapterResource(),
        },
    )


def batch_metadata(result: dg.ExecuteInProcessResult) -> dict:
    """The batch op's metadata, from its output or from its failure."""
    for event in result.all_node_events:
        if event.is_successful_output:
            entries = event.step_output_data.metadata
        elif event.is_step_failure:
            entries = event.step_failure_data.user_failure_data.metadata
        else:
            continue
        return {key: value.value for key, value in entries.items()}
    raise AssertionError("the batch op left no output and no failure")


def test_one_run_request_per_tick_and_none_new_on_a_second_evaluation(fleet_env, instance):
    _, store = fleet_env
    config_nodes = [n for n in make_adapter(fleet_env[0]).list_nodes() if n.pool_id == POOL]
    on = [n.node_id for n in config_nodes if n.state is NodeState.ON]
    for i in range(3):
        add(store, f"t1-{i}", T1, "cordon", on[i])
    add(store, "t1-hold", T1, "hold")  # recorded only: no node action
    add(store, "t1-blocked", T1, "cordon", on[3], allowed=False)
    add(store, "t1-shadow", T1, "cordon", on[4], shadow=True)
    add(store, "t2-0", T2, "scale_up", count=1)
    before = store.query("SELECT * FROM decisions ORDER BY decision_id")

    first = sensor_requests(instance, store)
    assert [r.run_key for r in first] == [
        batch_id_for(DecisionKind.SCALE, T1),
        batch_id_for(DecisionKind.SCALE, T2),
    ]
    assert {
        "scaling/batch_id": batch_id_for(DecisionKind.SCALE, T1),
        "scaling/tick": T1.isoformat(),
        "scaling/decisions": "3",
    }.items() <= first[0].tags.items()
    assert [r.run_key for r in sensor_requests(instance, store)] == [r.run_key for r in first]
    assert store.query("SELECT * FROM decisions ORDER BY decision_id").equals(before)  # the sensor only reads

    # T1 runs: T2's plan has replaced it, so its cordons are superseded, not carried out;
    # the sensor now asks only for T2.
    result = run_batch(instance, store, first[0])
    assert result.success
    meta = batch_metadata(result)
    assert meta["batch_id"] == batch_id_for(DecisionKind.SCALE, T1) and meta["counts_by_outcome"] == {
        "superseded": 3
    }
    assert [r.run_key for r in sensor_requests(instance, store)] == [batch_id_for(DecisionKind.SCALE, T2)]


def test_a_replayed_batch_carries_no_action_out_twice(fleet_env, instance):
    config, store = fleet_env
    nodes = [n for n in make_adapter(config).list_nodes() if n.pool_id == POOL]
    off = [n.node_id for n in nodes if n.state is not NodeState.ON]
    on = [n.node_id for n in nodes if n.state is NodeState.ON]
    assert len(off) >= 2  # the pool has the nodes the scale-up asks for
    ids = [add(store, "up", T1, "scale_up", count=2), add(store, "cordon", T1, "cordon", on[0])]
    [request] = sensor_requests(instance, store)
    first = run_batch(instance, store, request)
    assert first.success
    meta = batch_metadata(first)
    assert meta["counts_by_outcome"] == {"ok": 2}
    assert [row["status"] for row in (r.data for r in meta["outcomes"].records)] == ["ok", "ok"]
    done = decisions(store)
    assert all(done[i]["claimed_by"] == first.run_id and done[i]["batch_id"] == request.run_key for i in ids)
    assert done[ids[0]]["outcome"].startswith("ok: powered on")
    assert next(n for n in make_adapter(config).list_nodes() if n.node_id == on[0]).cordoned
    assert sensor_requests(instance, store) == []

    # Replayed (an operator's re-execution): every action is skipped, nothing is rewritten.
    again = run_batch(instance, store, request)
    assert again.success
    assert batch_metadata(again)["counts_by_outcome"] == {"skipped": 2}
    assert decisions(store) == done


class RecordingAdapter:
    """The calls a batch makes; `fail` makes one node's power-on raise."""

    def __init__(self, nodes: list[NodeInfo], fail: str | None = None, refused: str | None = None) -> None:
        self.nodes, self.fail, self.refused, self.calls = nodes, fail, refused, []

    def list_nodes(self):
        return list(self.nodes)

    def list_tasks(self):
        return []

    def power_on(self, node_id):
        self.calls.append(("power_on", node_id))
        if node_id == self.fail:
            raise ConnectionError("fleet API unreachable")
        return Outcome.success(f"{node_id} joins")

    def cordon(self, node_id):
        self.calls.append(("cordon", node_id))
        if node_id == self.refused:  # e.g. a Slurm node NOT_RESPONDING while slurmctld restarts
            return Outcome(OutcomeStatus.REFUSED, f"node {node_id} is in UNKNOWN: not acted on")
        known = any(n.node_id == node_id for n in self.nodes)
        return Outcome.success("cordoned") if known else Outcome(OutcomeStatus.GONE, f"no node {node_id}")


def _nodes(*states: NodeState) -> list[NodeInfo]:
    return [NodeInfo(f"n{i}", POOL, "A100-80GB", "z", 8, s) for i, s in enumerate(states)]


def test_a_node_the_backend_will_not_touch_is_infeasible_with_its_reason_not_a_failure(tmp_path):
    store = open_warehouse(tmp_path / "w.duckdb")
    adapter = RecordingAdapter(_nodes(NodeState.ON, NodeState.ON), refused="n1")
    add(store, "a", T1, "cordon", "n0")
    add(store, "b", T1, "cordon", "n1")
    results = execute_scaling_batch(store, adapter, T1, run_id="r1", now=T1, run_is_live=lambda _: False)
    assert [(r.decision_id, r.status) for r in results] == [("scale-a", "ok"), ("scale-b", "infeasible")]
    assert "UNKNOWN: not acted on" in decisions(store)["scale-b"]["outcome"]


def test_each_action_is_claimed_once_across_runs(tmp_path):
    store = open_warehouse(tmp_path / "w.duckdb")
    adapter = RecordingAdapter(_nodes(NodeState.ON, NodeState.WARM, NodeState.OFF))
    add(store, "a", T1, "power_on", "n1")
    add(store, "b", T1, "power_on", "n2")
    dead, live = {"r-dead"}, {"r-live"}
    store.execute("UPDATE decisions SET claimed_by = 'r-dead' WHERE decision_id = 'scale-a'")
    store.execute("UPDATE decisions SET claimed_by = 'r-live' WHERE decision_id = 'scale-b'")

    def is_live(run_id):
        assert run_id in dead | live
        return run_id in live

    results = execute_scaling_batch(store, adapter, T1, run_id="r1", now=T1, run_is_live=is_live)
    # A dead run's claim may have been half done: recorded as abandoned, never redone.
    # A live run's claim is left to that run.
    assert [(r.decision_id, r.status) for r in results] == [("scale-a", "abandoned"), ("scale-b", "skipped")]
    assert adapter.calls == []
    rows = decisions(store)
    assert (
        rows["scale-a"]["outcome"].startswith("abandoned: run r-dead")
        and rows["scale-b"]["executed_at"] is None
    )

    store.execute("UPDATE decisions SET claimed_by = NULL WHERE decision_id = 'scale-b'")
    results = execute_scaling_batch(store, adapter, T1, run_id="r2", now=T1, run_is_live=is_live)
    assert [r.status for r in results] == ["skipped", "ok"] and adapter.calls == [("power_on", "n2")]
    results = execute_scaling_batch(store, adapter, T1, run_id="r3", now=T1, run_is_live=is_live)
    assert [r.status for r in results] == ["skipped", "skipped"] and adapter.calls == [("power_on", "n2")]


def test_what_the_fleet_cannot_do_is_infeasible_and_the_run_succeeds(fleet_env, instance):
    config, store = fleet_env
    spare = [
        n for n in make_adapter(config).list_nodes() if n.pool_id == POOL and n.state is not NodeState.ON
    ]
    # The first scale-up takes every spare node of the pool, so the second finds none left
    # (the nodes it powered on are still warm or off until they join).
    add(store, "1-all", T1, "scale_up", count=len(spare))
    add(store, "2-more", T1, "scale_up", count=2)
    add(store, "3-gone", T1, "cordon", "no-such-node")
    [request] = sensor_requests(instance, store)
    result = run_batch(instance, store, request)
    assert result.success
    assert batch_metadata(result)["counts_by_outcome"] == {"infeasible": 2, "ok": 1}
    rows = decisions(store)
    assert rows["scale-2-more"]["outcome"].startswith("infeasible: no standby or off node left")
    assert rows["scale-3-gone"]["outcome"].startswith("infeasible:")
    assert sensor_requests(instance, store) == []  # recorded: nothing is retried


def test_an_adapter_that_raises_fails_the_run_after_recording_every_action(tmp_path, monkeypatch, instance):
    store = open_warehouse(tmp_path / "w.duckdb")
    adapter = RecordingAdapter(_nodes(NodeState.OFF, NodeState.OFF), fail="n0")
    add(store, "a", T1, "power_on", "n0")
    add(store, "b", T1, "power_on", "n1")
    results = execute_scaling_batch(store, adapter, T1, run_id="r1", now=T1, run_is_live=lambda _: False)
    assert [r.status for r in results] == ["error", "ok"]
    assert decisions(store)["scale-a"]["outcome"] == "error: ConnectionError: fleet API unreachable"

    class Raising(FleetAdapterResource):
        def get(self):
            return RecordingAdapter(_nodes(NodeState.OFF), fail="n0")

    add(store, "c", T2, "power_on", "n0")
    [request] = sensor_requests(instance, store)
    result = run_batch(instance, store, request, fleet=Raising())
    assert not result.success
    assert batch_metadata(result)["counts_by_outcome"] == {"error": 1}


def test_a_batch_a_later_plan_replaced_is_superseded(tmp_path):
    store = open_warehouse(tmp_path / "w.duckdb")
    adapter = RecordingAdapter(_nodes(NodeState.OFF))
    add(store, "old", T1, "power_on", "n0")
    add(store, "new", T2, "hold")
    [result] = execute_scaling_batch(store, adapter, T1, run_id="r1", now=T2, run_is_live=lambda _: False)
    assert result.status == "superseded" and adapter.calls == []
    assert decisions(store)["scale-old"]["outcome"].startswith("superseded: the plan of")


def test_a_batch_that_stops_early_keeps_what_it_did_and_hands_back_the_rest(tmp_path):
    store = open_warehouse(tmp_path / "w.duckdb")
    for key in ("a", "b", "c"):
        add(store, key, T1, "cordon", key)
    acted = []

    def act(row):
        acted.append(row["decision_id"])
        if row["decision_id"] == "scale-b":
            raise OSError("warehouse disk gone")  # not an adapter outcome: the run stops
        return result_for(row, "ok", "cordoned")

    def run(run_id):
        return carry_out(
            store,
            batch_rows(store, DecisionKind.SCALE, T1),
            batch_id="b1",
            run_id=run_id,
            now=T1,
            run_is_live=lambda _: False,
            resumable=False,
            act=act,
        )

    with pytest.raises(OSError):
        run("r1")
    rows = decisions(store)
    assert rows["scale-a"]["outcome"] == "ok: cordoned"  # recorded although the batch stopped
    assert rows["scale-b"]["claimed_by"] == "r1" and rows["scale-b"]["executed_at"] is None
    assert rows["scale-c"]["claimed_by"] is None  # never acted on: handed back
    assert [r.status for r in run("r2")] == ["skipped", "abandoned", "ok"]
    assert acted == ["scale-a", "scale-b", "scale-c"]
