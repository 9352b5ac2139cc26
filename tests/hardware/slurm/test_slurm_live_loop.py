"""The control loop live on real Slurm daemons: the loop's assets, sensors and action jobs run
in-process (dg.materialize, the sensors' run requests executed) against a local cluster of
4 nodes (2 x 2 A100, 2 x 4 H800 GPUs) for a few ticks, as `make up` with `MP__ADAPTER__BACKEND=slurm` runs them
on the wall clock.

Three things differ from the wall-clock loop, all only to fit a test's minute and to make the
loop's decisions known in advance:
- the loop's clock (`adapter_now`) starts at the next full hour and jumps one tick (5 min) per
  tick, so the scaler's hysteresis and the tick grid move on and every tick falls in that one
  hour, whatever the wall clock's minute; Slurm, the drains and metering keep real time;
- the warehouse of the scenario starts with three days of steady demand (the running GPUs of
  the jobs the test submits, metered hour by hour up to the loop's hour), so the forecast and
  the scaler see a flat history, not a fresh warehouse whose first ticks vary;
- each tick meters the loop's hour and reads the wall hour's telemetry before they close
  (Dagster's clock is moved an hour past the loop's for those runs only); the wall hours are
  metered once the ticks are done, as their hourly runs would at their close.

Skipped, with the reason, where the Slurm binaries are missing or the suite is not root.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.test_utils import freeze_time
from test_slurm_cluster import wait_for  # the one bounded poll of the Slurm tests

from assets.drains.assets import drain_assets
from assets.drains.jobs import drain_job
from assets.fleet.assets import fleet_inventory
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.market.assets import market_assets
from assets.metering.assets import usage_intervals
from assets.scaling.assets import scaling_assets
from assets.scaling.jobs import scaling_actions_job
from assets.telemetry.assets import telemetry_samples
from assets.telemetry.checks import telemetry_checks
from market_pipeline.billing.metering import USAGE_INTERVAL_SCHEMA, HourWindow
from market_pipeline.config import load_config
from market_pipeline.hardware.slurm.adapter import SlurmAdapter, split_task_id
from market_pipeline.hardware.slurm.client import SlurmError
from market_pipeline.hardware.slurm.cluster import ClusterSpec, LocalCluster, NodeGroup, missing_binaries
from market_pipeline.hardware.slurm.workload import JobSpec, submit
from market_pipeline.warehouse import Warehouse
from sensors.drain import drain_sensor
from sensors.scaling import scaling_sensor

pytestmark = [
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Slurm not installed: missing {missing_binaries()}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs slurmd, which needs root"),
    pytest.mark.slow,
]
UTC = timezone.utc
TICK = timedelta(minutes=5)
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
    """The loop's clock: the wall clock plus one tick per tick the test has run, from the
    next full hour on (`start_next_hour`)."""

    offset: timedelta = field(default_factory=timedelta)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def start_next_hour(self) -> datetime:
        """Move the loop to the start of the next wall-clock hour; returns that hour."""
        wall = datetime.now(UTC)
        hour = wall.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        self.offset = hour - wall
        return hour


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
    loop_hour: datetime  # the hour the loop's ticks fall in
    wall_hour: datetime  # the wall-clock hour the test started in
    runs: list[tuple[str, bool]] = field(default_factory=list)


@pytest.fixture(scope="module")
def cluster_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
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
    cluster.up()
    try:
        yield cluster, home
    finally:
        cluster.down()


@pytest.fixture
def live(cluster_home: tuple[LocalCluster, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Live:
    """The shared cluster with this test's own warehouse, adapter state, Dagster instance and
    loop clock (the suite clears MP__* before each test), so that no test's ticks depend on
    another's or on their order."""
    cluster, home = cluster_home
    env = {f"MP__{k}": v for k, v in SETTINGS.items()} | {
        "MARKET_PIPELINE_CONFIG": str(home / "market.toml"),
        "MP__ADAPTER__BACKEND": "slurm",
        "MP__ADAPTER__SLURM_CONF": str(cluster.conf),
        "MP__ADAPTER__STATE_PATH": str(tmp_path / "fleet.json"),
        "MP__WAREHOUSE__PATH": str(tmp_path / "w.duckdb"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    wall_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    loop_hour = CLOCK.start_next_hour()
    warehouse = WarehouseResource(path=env["MP__WAREHOUSE__PATH"])
    resources = {"warehouse": warehouse, "fleet": TickingFleet()}
    return Live(
        cluster, env, resources, dg.DagsterInstance.ephemeral(), warehouse.get(), loop_hour, wall_hour
    )


def run_tick(live: Live) -> None:
    """One tick as the schedules and sensors run it: inventory, the wall hour's telemetry and
    the loop hour's metering, the control tick, then the runs the scaling and drain sensors ask for."""
    res = live.resources

    def record(name: str, result: dg.ExecuteInProcessResult) -> None:
        live.runs.append((name, result.success))
        assert result.success, f"{name} failed: {[e.message for e in result.all_events if e.is_failure]}"

    record(
        "fleet",
        dg.materialize([fleet_inventory], resources=res, instance=live.instance, raise_on_error=False),
    )
    # the telemetry job's run: samples and their data-quality checks (a blocking check that
    # fails fails the run, as in the live loop)
    materialize_hour(live, [telemetry_samples, *telemetry_checks], datetime.now(UTC), record)
    materialize_hour(live, [usage_intervals], CLOCK.now(), record)
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
        dg.materialize(
            tick, selection=selection, resources=res, instance=live.instance, raise_on_error=False
        ),
    )
    for sensor, job in ((scaling_sensor, scaling_actions_job), (drain_sensor, drain_job)):
        context = dg.build_sensor_context(instance=live.instance, resources=res)
        for request in sensor.evaluate_tick(context).run_requests:
            result = job.execute_in_process(
                run_config=request.run_config,
                resources=res,
                instance=live.instance,
                tags=request.tags,
                raise_on_error=False,
            )
            record(job.name, result)
    CLOCK.offset += TICK


def materialize_hour(
    live: Live,
    assets: list,
    moment: datetime,
    record: Callable[[str, dg.ExecuteInProcessResult], None],
) -> None:
    """The hourly partition holding `moment` of `assets` (and checks), read before it closes."""
    hour = moment.strftime("%Y-%m-%d-%H:00")
    with freeze_time(max(CLOCK.now(), datetime.now(UTC)) + timedelta(hours=1)):
        result = dg.materialize(
            assets,
            partition_key=hour,
            resources=live.resources,
            instance=live.instance,
            raise_on_error=False,
        )
    record(assets[0].key.path[-1], result)


def seed_steady_demand(live: Live, gpus_by_pool: dict[str, list[tuple[str, str]]], days: int = 3) -> None:
    """Metered usage of the last `days` days up to the loop's hour: in every pool the GPUs
    (node, tenant) the test's jobs hold, every hour (a finished run per GPU and hour), so
    demand history and forecast are flat at what runs now."""
    config = load_config()
    pools = {p.pool_id: p for p in config.pools}
    hours = [live.loop_hour - timedelta(hours=h) for h in range(days * 24, 0, -1)]
    rows = [
        {
            "interval_id": f"seed-{pool_id}-{i}-{key}",
            "task_id": f"seed-{pool_id}-{i}-{key}",
            "tenant_id": tenant,
            "pool_id": pool_id,
            "gpu_model": pools[pool_id].gpu_model,
            "zone": pools[pool_id].zone,
            "resource_class": "drainable",
            "node_id": node,
            "gpu_uuid": f"{node}:gpu{i}",
            "gpu_fraction": Decimal(1),
            "mig_profile": None,
            "mem_mib": 0,
            "started_at": hour,
            "ended_at": hour + timedelta(hours=1),
            "end_reason": "end",
            "drain_signal_at": None,
            "platform_fault": False,
            "partition_key": key,
        }
        for hour in hours
        if (key := HourWindow.containing(hour).partition_key)
        for pool_id, holders in gpus_by_pool.items()
        for i, (node, tenant) in enumerate(holders)
    ]
    assert live.warehouse.append("usage_intervals", pl.DataFrame(rows, schema=USAGE_INTERVAL_SCHEMA)) == len(
        rows
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
    guaranteed_task = wait_for(lambda: _task(adapter, guaranteed), 30, "guaranteed job running")
    assert first_task.node_id != second_task.node_id
    wait_for(lambda: _declared(adapter, (first, second)), 20, "signal handlers declared")
    h800, a100 = first_task.pool_id, guaranteed_task.pool_id
    holders = {
        h800: [(first_task.node_id, "acme-research"), (second_task.node_id, "ember-ai")],
        a100: [(guaranteed_task.node_id, "delta-vision")],
    }
    seed_steady_demand(live, holders)
    store = live.warehouse

    # Each pool needs one node (2 of 4 H800 GPUs, 1 of 2 A100 GPUs) and has two: the surplus
    # node waits out the hysteresis (10 min: ticks 1 and 2), is cordoned at tick 3 (A100: the
    # empty one), the H800 one is drained through the guardrail at tick 4.
    for tick in range(1, 5):
        run_tick(live)
        scale = _scale_decisions(store, tick)
        if tick < 3:
            assert {(d["pool_id"], d["action"], d["allowed"]) for d in scale} == {
                (h800, "scale_down", False),
                (a100, "scale_down", False),
            }, scale
            assert all(d["reasons"][0].startswith("hysteresis") for d in scale), scale
        elif tick == 3:
            cordons = {d["pool_id"]: d for d in scale if d["action"] == "cordon"}
            assert set(cordons) == {h800, a100} and all(d["allowed"] for d in cordons.values()), scale
            assert cordons[a100]["target"] != guaranteed_task.node_id, scale
            assert not _drained(store)
    assert len(_drained(store)) == 1, _decisions(store)
    # the rigid guarantee's passes on Slurm's queue ran in the drain plan (rules 4, 5 and 6): no
    # guaranteed job waits; the guaranteed arrival's like is forecast within the SLA wait, and the
    # free GPU beside it (the other A100 node is cordoned) is kept from drainable work
    event = live.instance.get_latest_materialization_event(dg.AssetKey("drain_requests"))
    assert event is not None and event.asset_materialization is not None
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    assert meta["closed_to_drainable"] == [] and meta["kept_from_drainable_refused"] == "-", meta
    assert meta["kept_from_drainable"] == [guaranteed_task.node_id], meta

    # telemetry: Slurm's allocation samples are clean, the fields it cannot measure not reported
    ingests = store.query("SELECT sum(clean) AS clean, sum(quarantined) AS q FROM telemetry_ingests").row(0)
    assert ingests[0] > 0 and ingests[1] == 0
    assert store.query("SELECT count(*) FROM telemetry_clean WHERE power_w IS NOT NULL").item() == 0
    # forecast, prices and the scaling plan every tick
    assert store.query("SELECT count(DISTINCT tick_at) FROM market_ticks").item() >= 2
    assert store.query("SELECT count(*) FROM price_book WHERE source <> 'config'").item() > 0
    # a scale-down of a busy H800 node went through the drain guardrail
    drained = _drained(store)
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
    # the wall hours close and are metered (their hourly runs)
    hour = live.wall_hour
    while hour < live.loop_hour:
        materialize_hour(
            live, [usage_intervals], hour, lambda name, result: live.runs.append((name, result.success))
        )
        hour += timedelta(hours=1)
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


def _scale_decisions(store: Warehouse, tick: int) -> list[dict]:
    """The scaling plan's decisions of the loop's `tick`-th tick (1 = the loop's first)."""
    at = CLOCK.now().replace(minute=0, second=0, microsecond=0) + (tick - 1) * TICK  # one hour's ticks
    return store.query(
        "SELECT pool_id, action, target, allowed, reasons FROM decisions WHERE kind = 'scale' AND decided_at = ?",
        [at],
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
