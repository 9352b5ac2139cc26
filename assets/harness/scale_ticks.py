"""`market-pipeline bench scale` (the default, whole-tick mode): control ticks per hour on the
cluster profile, the loop's own jobs on 1 and on N dagster-celery workers, in the same run.

What one tick is. For a tick at time T (one simulated hour after the last), the jobs the
loop's schedules and sensors launch, in their order, each a Dagster run whose steps execute on
the Celery workers (the project's definitions, the same assets and ops, nothing copied):
`control_loop_job` tagged with T (the twin moves on to T; inventory, demand, forecast, the
market tick, the price book, the scaling plan, the drain requests), `telemetry_job` for the
hour that closed at T (its samples screened into clean and quarantined rows), `metering_job`
for that hour (per-second usage from the task events), and `scaling_actions_job` for T (the
plan's decisions claimed and carried out). The fleet is the node list of `fleet_source` (the
Alibaba spot trace's 4,278 nodes for the target), simulated by the twin.

Why 2 workers can take 2 ticks at once. One fleet's ticks are a chain (each moves the twin on
and prices from the last), so the bench runs `lanes` cells side by side: each lane is the whole
fleet with its own twin, its own DuckLake (a catalog database of its own and a data folder)
and its own control schema, as a region or a tenant's dedicated cluster would be. A lane's
driver, a process of its own (the daemon's run launcher would start a run worker per run),
launches its ticks' runs one after another and follows their steps; the broker hands each
step to whichever worker is free. Lanes share the broker, the Dagster instance (PostgreSQL)
and the PostgreSQL server. Ticks per hour = all lanes' ticks over the wall time from the first
run's launch to the last run's end.

Single-threaded workers. Each worker is one process that runs its steps itself, one at a time
(Celery's solo pool, without broker heartbeats, which its loop cannot answer during a step; a
forked pool child of a worker that had loaded the definitions hung in its first step), with
POLARS_MAX_THREADS, OMP/MKL/OPENBLAS/NUMEXPR_NUM_THREADS (torch's intra-op pool follows OMP)
and MP_DUCKDB_THREADS (`SET threads` on the lake's DuckDB instance) at 1, so 1 worker is one
core's worth of work and 2 workers two: on a 2-core machine the ratio says whether the
profile scales out, not whether a library finds more threads. The lane drivers, PostgreSQL and
RabbitMQ run on the same cores and are not limited.

What it accounts, per count (the issue's guarantees): `lost_rows`, telemetry rows an ingest
took in that are neither clean nor quarantined, plus the metered seconds each metering run
reported that the lake does not hold for its hour (either way round); `duplicate_decisions`,
decision ids stored twice in the lake plus decisions two batch runs both carried out;
`failed_runs`, runs that did not succeed (and ticks a driver could not finish).

What it does NOT measure: the loop's cadence (live, the market tick runs every
`loop.tick_minutes` and telemetry and metering once an hour; here a tick is one market tick
with one hour's telemetry and metering, and each lane's first tick also moves the twin on from
when it was made, up to an hour), billing (the dbt build is its own job, serialised by the
`billing_dbt` pool, and not in the tick), drains (a drain request's batch is a sensor's run
and the spot fleet's ticks here rarely plan one), the Dagster daemon's own latency (the
drivers launch runs directly) and the schedules' spacing (a tick follows the last as soon as
it ends). The setup of each count (lakes migrated, twins made, workers started) is not timed.
Everything it creates (the Dagster database, each lane's catalog database, schema and data)
is dropped afterwards.
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from assets.harness.soak import INSTANCE_YAML, PG_ADMIN_URL, celery_workers, duplicate_actions, soak_database

TARGET_SPEEDUP = 1.5  # issue #43: 2 workers give at least 1.5x the ticks per hour of 1
REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "market_pipeline" / "defaults" / "market.toml"
SPOT_FLEET = REPO.parent / "shared" / "data" / "alibaba-spot-2026" / "node_info_df.csv"
# One core's worth of threads per worker process (see the module's docstring).
SINGLE_THREADED = {
    "POLARS_MAX_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "MP_DUCKDB_THREADS": "1",
}
DEFINITIONS = "sensors.definitions"
DRIVER_TIMEOUT_S = 3600  # a lane that has not finished in an hour has hung
TICK_JOBS = ("control_loop_job", "telemetry_job", "metering_job", "scaling_actions_job")


@dataclass(frozen=True)
class Lane:
    """One cell: the fleet with its own twin, lake and control schema, named by its config."""

    index: int
    config_path: Path
    catalog_url: str
    data_path: str
    control_schema: str


# The test's way to break a tick (a lost row): called by a lane's driver after each tick with
# the lane's index, its warehouse and the tick's telemetry partition. Never set by the command.
AfterTick = Callable[[int, Any, str], None]


@dataclass(frozen=True)
class WholeTickSettings:
    fleet_source: str = str(SPOT_FLEET)
    workers: tuple[int, ...] = (1, 2)
    lanes: int = 2
    ticks: int = 2  # per lane
    rounds: int = 1  # each count this many times, counts alternating; the median run is kept
    admin_url: str = PG_ADMIN_URL
    after_tick: AfterTick | None = field(default=None, compare=False)


def lane_config_text(base: str, lane: Lane, fleet_source: str) -> str:
    """The shipped config with this lane's lake, twin and control schema (the cluster profile)."""
    replaced = {
        'path = "var/warehouse.duckdb"': "\n".join(
            [
                'backend = "ducklake"',
                f'catalog_url = "{lane.catalog_url}"',
                f'data_path = "{lane.data_path}"',
            ]
        ),
        'state_path = "var/fleet_state.json"': f'state_path = "var/lane{lane.index}/fleet_state.json"\n'
        'state_store = "control"',
        'fleet_source = "config"': f'fleet_source = "{fleet_source}"',
    }
    text = base
    for old, new in replaced.items():
        if old not in text:
            raise ValueError(f"the shipped config has no line {old!r} to set for a lane")
        text = text.replace(old, new, 1)
    return text + f'\n[control]\nbackend = "postgres"\nschema_name = "{lane.control_schema}"\n'


def _catalog_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg2://", "postgresql://", 1)


@contextmanager
def _lanes(settings: WholeTickSettings, home: Path) -> Iterator[list[Lane]]:
    """`settings.lanes` lanes, each with a catalog database of its own (dropped afterwards)."""
    base = DEFAULT_CONFIG.read_text()
    with ExitStack() as stack:
        lanes = []
        for i in range(settings.lanes):
            url = _catalog_url(
                stack.enter_context(soak_database(settings.admin_url, prefix="mp_scale_lane_"))
            )
            lane = Lane(i, home / f"lane{i}.toml", url, f"{home}/lake{i}/", f"scale_lane{i}")
            lane.config_path.write_text(lane_config_text(base, lane, settings.fleet_source))
            lanes.append(lane)
        yield lanes


def _prepare(lane: Lane) -> datetime:
    """Migrate the lane's lake and control schema, make its twin; the first tick's time (an hour
    into the fleet's history, so the first tick has a closed hour to ingest)."""
    from market_pipeline.config import load_config
    from market_pipeline.hardware import make_adapter
    from market_pipeline.warehouse.profile import configured_control, configured_warehouse

    config = load_config(lane.config_path)
    configured_warehouse(config, migrate=True)
    control = configured_control(config)
    assert control is not None
    control.migrate()
    return make_adapter(config).now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def _run_config(lane: Lane, job: str, tick: datetime) -> dict[str, Any]:
    from assets.lib.resources import WarehouseResource
    from assets.scaling.jobs import SCALING_OP_NAME
    from market_pipeline.config import load_config

    warehouse = WarehouseResource.from_config(load_config(lane.config_path))  # the lane's lake
    fields = ("path", "backend", "catalog_url", "data_path", "control_url", "control_schema")
    resources = {
        "warehouse": {"config": {name: getattr(warehouse, name) for name in fields}},
        "fleet": {"config": {"config_path": str(lane.config_path)}},
    }
    ops = {SCALING_OP_NAME: {"config": {"tick": tick.isoformat()}}} if job == "scaling_actions_job" else {}
    return {"resources": resources, **({"ops": ops} if ops else {})}


def _drive(lane: Lane, start: datetime, settings: WholeTickSettings, ready: Any, results: Any) -> None:
    """One lane's ticks, one after another, each tick's jobs in the loop's order: the process
    that launches the lane's runs and follows their steps (a run worker's part, where the
    daemon's run launcher would start one per run). It waits at `ready` with the others before
    the clock starts and puts what it did on `results`."""
    import dagster as dg
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    from assets.lib.schedules import closed_hour_key
    from assets.lib.tags import tick_tags
    from market_pipeline.config import load_config
    from market_pipeline.warehouse.profile import configured_warehouse

    # by module name: the workers imported it before they were ready (`-i`), so a step finds
    # the definitions loaded
    repository = ReconstructableRepository.for_module(DEFINITIONS, "defs", working_directory=str(REPO))
    jobs = {name: repository.get_reconstructable_job(name) for name in TICK_JOBS}
    runs: list[tuple[str, str, str]] = []  # (job, partition, run id)
    out: dict[str, Any] = {"lane": lane.index, "runs": runs, "ticks_done": 0, "error": None}
    with ExitStack() as stack:
        try:
            # Load the definitions and open the instance before the clock starts, as a run
            # worker has them: a reconstructable job is only a pointer, and the first run
            # imported the whole project, about 8 CPU-seconds per driver, in the timed part
            # and against the workers' cores.
            for job in jobs.values():
                job.get_definition()
            instance = stack.enter_context(dg.DagsterInstance.get())
        except Exception as exc:  # noqa: BLE001 - counted as the lane's failure, as below
            out["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        ready.wait(600)  # all drivers loaded: the clock starts
        out["began"], cpu_began = time.time(), time.process_time()
        try:
            for k in range(settings.ticks if out["error"] is None else 0):
                tick = start + timedelta(hours=k)
                hour = closed_hour_key(tick)
                for name in TICK_JOBS:
                    tags = dict(tick_tags(tick))
                    if name in ("telemetry_job", "metering_job"):
                        tags["dagster/partition"] = hour
                    result = dg.execute_job(
                        jobs[name],
                        instance=instance,
                        run_config=_run_config(lane, name, tick),
                        tags=tags,
                        raise_on_error=False,
                    )
                    runs.append((name, hour, result.run_id))
                if settings.after_tick is not None:
                    settings.after_tick(lane.index, configured_warehouse(load_config(lane.config_path)), hour)
                out["ticks_done"] = k + 1
        except Exception as exc:  # noqa: BLE001 - a driver that cannot go on is a failed tick, counted
            out["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        out["ended"] = time.time()
        out["cpu_seconds"] = time.process_time() - cpu_began
    results.put(out)


def _cpu_seconds_now(worker_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of the workers (with the processes their steps started) and of the
    PostgreSQL and RabbitMQ servers (every client's, not only the bench's)."""
    from market_pipeline.hardware.process_tree import server_cpu_seconds, tree_cpu_seconds

    return {
        "workers": sum(tree_cpu_seconds(pid) for pid in worker_pids),
        "postgres_server": server_cpu_seconds("postgres"),
        "rabbitmq_server": server_cpu_seconds("beam.smp"),
    }


def _drive_lanes(
    lanes: list[Lane], starts: list[datetime], settings: WholeTickSettings, worker_pids: list[int]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Every lane's driver in a fresh process (spawned: it loads the definitions with this
    count's environment), the clock started when all have loaded them; what each did, by lane,
    and the CPU seconds each part spent while the clock ran (the drivers' own, from each)."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(len(lanes) + 1), ctx.Queue()  # the drivers, and this process
    drivers = [
        ctx.Process(target=_drive, args=(lane, start, settings, ready, results))
        for lane, start in zip(lanes, starts)
    ]
    try:
        for driver in drivers:
            driver.start()
        ready.wait(900)
        began = _cpu_seconds_now(worker_pids)
        outs = [results.get(timeout=DRIVER_TIMEOUT_S) for _ in drivers]
        ended = _cpu_seconds_now(worker_pids)
        for driver in drivers:
            driver.join(60)
        cpu = {"drivers": sum(float(out.get("cpu_seconds", 0.0)) for out in outs)}
        cpu |= {part: ended[part] - began[part] for part in began}
        return sorted(outs, key=lambda out: out["lane"]), cpu
    finally:
        for driver in drivers:
            if driver.is_alive():
                driver.kill()


def _metered_seconds_missing(instance, store, runs: list[tuple[str, str, str]]) -> int:
    """Per metering run: the metered seconds it reported against what the lake holds for its hour."""
    import dagster as dg

    from market_pipeline.warehouse.readers import metered_seconds_held

    missing = 0
    for job, hour, run_id in runs:
        if job != "metering_job":
            continue
        reported = 0
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            value = entry.asset_materialization.metadata.get("metered_seconds")
            reported += int(value.value) if value is not None else 0
        missing += abs(reported - metered_seconds_held(store, hour))
    return missing


def _one_count(settings: WholeTickSettings, count: int, queue: str) -> dict[str, Any]:
    import dagster as dg

    from market_pipeline.billing.dbt_project import environment_overrides
    from market_pipeline.config import load_config
    from market_pipeline.warehouse.lake import forget_instance
    from market_pipeline.warehouse.profile import configured_lake, configured_warehouse
    from market_pipeline.warehouse.readers import decisions_stored_twice, telemetry_rows_unaccounted

    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp,
        soak_database(settings.admin_url, prefix="mp_scale_dagster_") as dagster_url,
    ):
        home = Path(tmp)
        dagster_home = home / "dagster_home"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text(INSTANCE_YAML.format(url=dagster_url, pools=""))
        with _lanes(settings, home) as lanes:
            env = {
                "MARKET_PIPELINE_HOME": str(home),
                "DAGSTER_HOME": str(dagster_home),
                "MARKET_PIPELINE_CONFIG": str(lanes[0].config_path),  # what the definitions load
                "MP__ORCHESTRATION__EXECUTOR": "celery",
                # one queue for the whole bench: this process loads the definitions (and their executor's
                # queue) once
                "MP__ORCHESTRATION__CELERY_QUEUE": queue,
                **SINGLE_THREADED,
            }
            with environment_overrides(env):
                starts = [_prepare(lane) for lane in lanes]
                with celery_workers(
                    count, dagster_home, solo=True, includes=(DEFINITIONS,), name=f"{queue}_w"
                ) as worker_pids:
                    outs, cpu = _drive_lanes(lanes, starts, settings, worker_pids)
                    wall = max(out["ended"] for out in outs) - min(out["began"] for out in outs)
                per_lane = []
                with dg.DagsterInstance.get() as instance:
                    for lane, out in zip(lanes, outs):
                        config = load_config(lane.config_path)
                        store = configured_warehouse(config)
                        per_lane.append(
                            {
                                "ticks": int(out.get("ticks_done", 0)),
                                "lost_rows": telemetry_rows_unaccounted(store)
                                + _metered_seconds_missing(instance, store, out.get("runs", [])),
                                "duplicate_decisions": decisions_stored_twice(store),
                            }
                        )
                        forget_instance(configured_lake(config))
                    # batch runs of one lane that carried one decision out twice (the instance's
                    # outcome tables); the lanes are copies of one fleet, so their decisions share ids
                    carried_twice = sum(
                        duplicate_actions(instance, {run_id for _, _, run_id in out.get("runs", [])})
                        for out in outs
                    )
                    failed = instance.get_runs_count(
                        dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED])
                    )
                    runs = instance.get_runs_count()
            done = sum(int(out.get("ticks_done", 0)) for out in outs)
            return {
                "workers": count,
                "lanes": settings.lanes,
                "ticks": done,
                "runs": runs,
                "seconds": round(wall, 2),
                "ticks_per_hour": round(done / wall * 3600, 1) if wall > 0 else 0.0,
                "lost_rows": sum(lane["lost_rows"] for lane in per_lane),
                "duplicate_decisions": sum(lane["duplicate_decisions"] for lane in per_lane) + carried_twice,
                "failed_runs": failed + sum(1 for out in outs if out.get("error")),
                "errors": [out["error"] for out in outs if out.get("error")],
                "per_lane": per_lane,
                # while the clock ran: where the CPU went (the servers' figures include their
                # other clients on a shared machine)
                "cpu_seconds": {part: round(value, 2) for part, value in cpu.items()},
                "cpu_seconds_per_tick": {
                    part: round(value / done, 2) if done else 0.0 for part, value in cpu.items()
                },
            }


def run_whole_tick_bench(settings: WholeTickSettings) -> dict[str, Any]:
    """Each count `rounds` times, the counts alternating (a shared machine's drifting load
    weighs on every count alike); each count's run of median rate is reported, with every
    round's rate and the load average before and after."""
    import os

    counts = sorted(set(settings.workers) | {1})
    load_before = [round(x, 2) for x in os.getloadavg()]
    rounds: dict[str, list[dict[str, Any]]] = {str(n): [] for n in counts}
    queue = f"mp_scale_{uuid.uuid4().hex[:8]}"
    for _ in range(settings.rounds):
        for n in counts:
            rounds[str(n)].append(_one_count(settings, n, queue))
    runs = {n: sorted(done, key=lambda r: r["ticks_per_hour"])[len(done) // 2] for n, done in rounds.items()}
    base = runs["1"]["ticks_per_hour"]
    speedups = {n: round(r["ticks_per_hour"] / base, 3) if base else 0.0 for n, r in runs.items() if n != "1"}
    clean = all(
        r["lost_rows"] == 0 and r["duplicate_decisions"] == 0 and r["failed_runs"] == 0
        for done in rounds.values()
        for r in done
    )
    return {
        "bench": "scale",
        "measures": "whole control ticks (telemetry, metering, market tick, decisions) through Dagster "
        "on N single-threaded dagster-celery workers",
        "fleet_source": settings.fleet_source,
        "lanes": settings.lanes,
        "ticks_per_lane": settings.ticks,
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "rounds": {n: [r["ticks_per_hour"] for r in done] for n, done in rounds.items()},
        "median_seconds": {n: statistics.median(r["seconds"] for r in done) for n, done in rounds.items()},
        "runs": runs,
        "ticks_per_hour": {n: r["ticks_per_hour"] for n, r in runs.items()},
        "cpu_seconds_per_tick": {n: r["cpu_seconds_per_tick"] for n, r in runs.items()},
        "speedup_over_1": speedups,
        "lost_rows": sum(r["lost_rows"] for done in rounds.values() for r in done),
        "duplicate_decisions": sum(r["duplicate_decisions"] for done in rounds.values() for r in done),
        "failed_runs": sum(r["failed_runs"] for done in rounds.values() for r in done),
        "target_speedup_2": TARGET_SPEEDUP,
        "within_target": clean and speedups.get("2", 0.0) >= TARGET_SPEEDUP,
    }
