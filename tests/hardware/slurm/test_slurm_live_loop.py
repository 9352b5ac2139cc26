"""The control loop live on real Slurm daemons: the loop's assets, sensors and action jobs run
in-process (dg.materialize, the sensors' run requests executed) against a local cluster of
4 nodes (2 x 2 A100, 2 x 4 H800 GPUs) for a few ticks, as `make up` with `MP__ADAPTER__BACKEND=slurm` runs them
on the wall clock.

Two things differ from the wall-clock loop, both only to fit a test's minute:
- the loop's clock (`adapter_now`) jumps one tick (5 min) per tick, so the scaler's
  hysteresis and the tick grid move on; Slurm, the drains and metering keep real time;
- the current hour's telemetry and metering partitions are read before the hour closes
  (Dagster's clock is moved an hour on for those two runs only).

Skipped, with the reason, where the Slurm binaries are missing or the suite is not root.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

import dagster as dg
import pytest
from dagster._core.test_utils import freeze_time

from assets.billing import usage_intervals
from assets.drain import drain_assets
from assets.fleet import fleet_inventory
from assets.market import market_assets
from assets.resources import FleetAdapterResource, WarehouseResource
from assets.scaling import scaling_assets
from assets.telemetry import telemetry_samples
from market_pipeline.config import load_config
from market_pipeline.hardware.slurm.adapter import SlurmAdapter, split_task_id
from market_pipeline.hardware.slurm.client import SlurmError
from market_pipeline.hardware.slurm.cluster import ClusterSpec, LocalCluster, NodeGroup, missing_binaries
from market_pipeline.hardware.slurm.workload import JobSpec, submit
from market_pipeline.warehouse import Warehouse
from sensors.drain import drain_sensor
from sensors.jobs import drain_job, scaling_actions_job
from sensors.scaling import scaling_sensor

pytestmark = [
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Slurm not installed: missing {missing_binaries()}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs slurmd, which needs root"),
    pytest.mark.slow,
]
UTC = timezone.utc
TICK = timedelta(minutes=5)
T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]

# The shipped config with two pools the size of the test cluster.
POOLS = """
[[pools]]
gpu_model = "A100-80GB"
zone = "cn-hangzhou-a"
nodes = 2
gpus_per_node = 2
warm_nodes = 0
max_nodes = 2
price_min = 1.0
price_max = 9.0
base_price = 2.4

[[pools]]
gpu_model = "H800"
zone = "cn-beijing-b"
nodes = 2
gpus_per_node = 4
warm_nodes = 0
max_nodes = 2
price_min = 2.0
price_max = 14.0
base_price = 4.2

"""
SETTINGS = {
    "LOOP__SAMPLE_INTERVAL_SECONDS": "1",
    "ADAPTER__OPERATION_TIMEOUT_SECONDS": "10",
    # a scale-down once a node has been surplus for two ticks (the demand the loop meters has
    # settled by then: it rises over the first ticks as the running jobs' usage comes in),
    # worth it whatever it saves
    "SCALING__HYSTERESIS_MINUTES": "10",
    "SCALING__REPLACEMENT_COST_PER_NODE": "0",
    "SCALING__DRAIN_COST_PER_GPU": "0",
    "SCALING__WARM_RESERVE_FLEET_FRACTION": "0",
    "GUARDRAILS__TASK_DRAIN__LANDING_COOLDOWN_MINUTES": "0",
    "GUARDRAILS__TASK_DRAIN__WARN_SECONDS": "1",
    "GUARDRAILS__TASK_DRAIN__CHECKPOINT_TIMEOUT_SECONDS": "5",
    "GUARDRAILS__TASK_DRAIN__TERMINATE_TIMEOUT_SECONDS": "8",
    "GUARDRAILS__TASK_DRAIN__MAX_TOTAL_SECONDS": "40",
}


@dataclass
class LoopClock:
    """The loop's clock: the wall clock plus one tick per tick the test has run."""

    offset: timedelta = field(default_factory=timedelta)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


CLOCK = LoopClock()


class TickingSlurmAdapter(SlurmAdapter):
    def now(self) -> datetime:
        return CLOCK.now()


class TickingFleet(FleetAdapterResource):
    def get(self) -> SlurmAdapter:
        return TickingSlurmAdapter.from_config(self.config())


@dataclass
class Live:
    cluster: LocalCluster
    env: dict[str, str]
    resources: dict
    instance: dg.DagsterInstance
    warehouse: Warehouse
    runs: list[tuple[str, bool]] = field(default_factory=list)


@pytest.fixture(scope="module")
def cluster_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    home = tmp_path_factory.mktemp("live_slurm")
    spec = ClusterSpec(
        groups=(NodeGroup("a100_80gb", "cn-hangzhou-a", 2, 2, 8), NodeGroup("h800", "cn-beijing-b", 2, 4, 8)),
        kill_wait_seconds=2,
        min_job_age_seconds=300,
        suspend_timeout_seconds=2,
    )
    cluster = LocalCluster(home / "slurm", spec)
    shipped = (ROOT / "market_pipeline" / "defaults" / "market.toml").read_text()
    head, _, rest = shipped.partition("[[pools]]")
    (home / "market.toml").write_text(head + POOLS.lstrip() + rest[rest.index("# Tenants") :])
    env = {f"MP__{k}": v for k, v in SETTINGS.items()} | {
        "MARKET_PIPELINE_CONFIG": str(home / "market.toml"),
        "MP__ADAPTER__BACKEND": "slurm",
        "MP__ADAPTER__SLURM_CONF": str(cluster.conf),
        "MP__ADAPTER__STATE_PATH": str(home / "fleet.json"),
        "MP__WAREHOUSE__PATH": str(home / "w.duckdb"),
    }
    cluster.up()
    try:
        warehouse = WarehouseResource(path=env["MP__WAREHOUSE__PATH"])
        resources = {"warehouse": warehouse, "fleet": TickingFleet()}
        yield Live(cluster, env, resources, dg.DagsterInstance.ephemeral(), warehouse.get())
    finally:
        cluster.down()


@pytest.fixture
def live(cluster_home: Live, monkeypatch: pytest.MonkeyPatch) -> Live:
    """The cluster's config for this test (the suite clears MP__* before each test)."""
    for key, value in cluster_home.env.items():
        monkeypatch.setenv(key, value)
    return cluster_home


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout}s")


def run_tick(live: Live) -> None:
    """One tick as the schedules and sensors run it: inventory, the hour's telemetry and
    metering, the control tick, then the runs the scaling and drain sensors ask for."""
    res, instance = live.resources, live.instance

    def record(name: str, result: dg.ExecuteInProcessResult) -> None:
        live.runs.append((name, result.success))
        assert result.success, f"{name} failed: {[e.message for e in result.all_events if e.is_failure]}"

    record("fleet", dg.materialize([fleet_inventory], resources=res, instance=instance, raise_on_error=False))
    hour = datetime.now(UTC).strftime("%Y-%m-%d-%H:00")
    with freeze_time(datetime.now(UTC) + timedelta(hours=1)):  # the hour readable before it closes
        for asset in (telemetry_samples, usage_intervals):
            result = dg.materialize(
                [asset], partition_key=hour, resources=res, instance=instance, raise_on_error=False
            )
            record(asset.key.path[-1], result)
    tick = [
        fleet_inventory,
        telemetry_samples,
        usage_intervals,
        *market_assets,
        *scaling_assets,
        *drain_assets,
    ]
    selection = [*market_assets, *scaling_assets, *drain_assets]
    record(
        "control_loop",
        dg.materialize(tick, selection=selection, resources=res, instance=instance, raise_on_error=False),
    )
    for sensor, job in ((scaling_sensor, scaling_actions_job), (drain_sensor, drain_job)):
        context = dg.build_sensor_context(instance=instance, resources=res)
        for request in sensor.evaluate_tick(context).run_requests:
            result = job.execute_in_process(
                run_config=request.run_config,
                resources=res,
                instance=instance,
                tags=request.tags,
                raise_on_error=False,
            )
            record(job.name, result)
    CLOCK.offset += TICK


@pytest.mark.skipif(
    os.environ.get("MP_SLURM_LIVE_SCENARIO") != "1",
    reason="flaky in CI (1 of 3 clean-clone runs): on a fresh warehouse the scaler's first ticks "
    "vary, and the scale-down this scenario waits for may not come within its ticks; run it with "
    "MP_SLURM_LIVE_SCENARIO=1 (docs/hardware.md)",
)
def test_the_loop_runs_live_on_slurm_and_drains_a_scaled_down_node_through_the_guardrail(live: Live) -> None:
    adapter = TickingSlurmAdapter.from_config(load_config())
    client = live.cluster.client()
    jobs = live.cluster.home / "jobs"
    # the H800 pool: one drainable job on each node (the second placed while the first node is
    # held), so a scale-down to one node must drain a real job; A100: one guaranteed job
    [first] = submit(client, [JobSpec("acme-research", "h800", 1, 600, drainable=True)], jobs)
    first_task = wait_for(lambda: _task(adapter, first), 30, "first job running")
    client.update_node(first_task.node_id, "drain", "test placement")
    [second] = submit(client, [JobSpec("ember-ai", "h800", 1, 600, drainable=True)], jobs)
    second_task = wait_for(lambda: _task(adapter, second), 30, "second job running")
    client.update_node(first_task.node_id, "resume")
    [guaranteed] = submit(client, [JobSpec("delta-vision", "a100_80gb", 1, 600, drainable=False)], jobs)
    wait_for(lambda: _task(adapter, guaranteed), 30, "guaranteed job running")
    assert first_task.node_id != second_task.node_id
    wait_for(lambda: _declared(adapter, (first, second)), 20, "signal handlers declared")

    for _ in range(7):  # the scaler acts once the pools have been half empty for two ticks
        run_tick(live)
        if _drained(live.warehouse):
            break
    store = live.warehouse

    # telemetry: Slurm's allocation samples are clean, the fields it cannot measure not reported
    ingests = store.query("SELECT sum(clean) AS clean, sum(quarantined) AS q FROM telemetry_ingests").row(0)
    assert ingests[0] > 0 and ingests[1] == 0
    assert store.query("SELECT count(*) FROM telemetry_clean WHERE power_w IS NOT NULL").item() == 0
    # forecast, prices and the scaling plan every tick
    assert store.query("SELECT count(DISTINCT tick_at) FROM market_ticks").item() >= 2
    assert store.query("SELECT count(*) FROM price_book WHERE source <> 'config'").item() > 0
    # a scale-down of a busy H800 node went through the drain guardrail
    drained = _drained(store)
    assert drained, _decisions(store)
    row = drained[0]
    assert row["outcome"] == "terminated" and row["drain_signal_at"] is not None, row
    task_id, node_id = row["task_id"], row["node_id"]
    [reasons] = store.query("SELECT reasons FROM decisions WHERE target = ?", [task_id])["reasons"].to_list()
    assert reasons[0] == f"scale_down: scaler empties node {node_id}"
    log = _log(jobs, task_id)
    assert log.index("(warning)") < log.index("(request)") < log.index("(term)")
    # the drained job was requeued and runs again, on the H800 node that stays, from its checkpoint
    again = wait_for(lambda: _task(adapter, split_task_id(task_id)[0]), 40, "requeued job running again")
    assert again.task_id != task_id and again.node_id != node_id
    wait_for(lambda: "resume step=" in _log(jobs, task_id), 20, "resume from the checkpoint")
    # the guaranteed job and the other drainable job were never touched
    untouched = {guaranteed, *(j for j in (first, second) if j != split_task_id(task_id)[0])}
    assert untouched <= {split_task_id(t.task_id)[0] for t in adapter.list_tasks()}
    # the emptied node is powered down (Slurm power saving) once the loop sees it drained
    for _ in range(3):
        run_tick(live)
        if _powered_down(store, node_id):
            break
    assert _powered_down(store, node_id), _decisions(store)
    # metering: the drained run ends at its drain, with its warning (billing's grace starts
    # there); the requeued run is metered as its own task of the same tenant
    usage = store.query(
        "SELECT task_id, tenant_id, end_reason, drain_signal_at FROM usage_intervals WHERE task_id IN (?, ?)",
        [task_id, again.task_id],
    ).to_dicts()
    ends = {u["task_id"]: u for u in usage}
    assert ends[task_id]["end_reason"] == "drained" and ends[task_id]["drain_signal_at"] is not None
    assert ends[again.task_id]["end_reason"] == "running" and ends[again.task_id]["drain_signal_at"] is None
    assert {u["tenant_id"] for u in usage} == {row["tenant_id"]}
    assert live.runs and all(ok for _, ok in live.runs), live.runs


def _task(adapter: SlurmAdapter, job_id: str):
    return next((t for t in adapter.list_tasks() if split_task_id(t.task_id)[0] == job_id), None)


def _declared(adapter: SlurmAdapter, job_ids: tuple[str, ...]) -> bool:
    jobs = {j.job_id: j for j in adapter.slurm_jobs()}
    return all(i in jobs and "checkpoint" in jobs[i].comment for i in job_ids)


def _drained(store: Warehouse) -> list[dict]:
    return store.query(
        "SELECT task_id, tenant_id, node_id, outcome, drain_signal_at, grace_seconds FROM drain_billing_events"
    ).to_dicts()


def _powered_down(store: Warehouse, node_id: str) -> bool:
    return bool(
        store.query(
            "SELECT count(*) FROM decisions WHERE action = 'scale_down' AND target = ? AND outcome LIKE 'ok%'",
            [node_id],
        ).item()
    )


def _decisions(store: Warehouse) -> list[tuple]:
    return store.query(
        "SELECT action, target, allowed, outcome, reasons FROM decisions ORDER BY decided_at"
    ).rows()


def _log(jobs: Path, task_id: str) -> str:
    path = jobs / f"{split_task_id(task_id)[0]}.log"
    return path.read_text() if path.exists() else ""


def test_slurmctld_down_fails_the_tick_in_one_line_and_the_next_tick_resumes(live: Live) -> None:
    res, store = live.resources, live.warehouse
    run_tick(live)
    decided = store.query("SELECT decision_id, outcome FROM decisions ORDER BY decision_id").rows()
    live.cluster.stop_slurmctld()
    try:
        result = dg.materialize(
            [fleet_inventory], resources=res, instance=live.instance, raise_on_error=False
        )
        assert not result.success
        [failure] = [e for e in result.all_events if e.is_step_failure]
        cause = failure.step_failure_data.error.cause  # the run's error names the adapter's
        message = cause.message.strip()
        assert cause.cls_name == "SlurmUnavailable" and "\n" not in message, message
        assert "slurmctld is unreachable" in message
    finally:
        live.cluster.start_slurmctld()
    adapter = TickingSlurmAdapter.from_config(load_config())
    wait_for(lambda: _reachable(adapter), 20, "slurmctld back")
    live.runs.clear()
    run_tick(live)  # the next tick resumes
    assert live.runs and all(ok for _, ok in live.runs), live.runs
    # nothing decided before the outage was lost or changed
    after = dict(store.query("SELECT decision_id, outcome FROM decisions").rows())
    assert all(after.get(decision_id) == outcome for decision_id, outcome in decided)


def _reachable(adapter: SlurmAdapter) -> bool:
    try:
        return bool(adapter.list_nodes())
    except SlurmError:
        return False
