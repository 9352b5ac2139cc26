"""`market-pipeline bench soak`: the whole loop on dagster-postgres storage, every schedule and
sensor on, the simulated fleet on an accelerated clock, for N wall minutes.

The simulated daemon (assets/harness/sim_daemon.py) jumps from one schedule fire time to the next
as soon as the previous step's runs and sensor runs are done, so in N minutes each schedule
and sensor ticks many times. Storage is a PostgreSQL database made for the soak and dropped
after it; the warehouse and the twin live in a temporary project home.

What it reports, one JSON object:
- runs, failed_runs: every run the soak's instance holds, and those that failed;
- skipped_ticks: schedule fire times in the soak without a successful tick (skipped, failed
  or never evaluated);
- duplicate_actions: scaling or drain decisions carried out (not skipped) by two runs, from
  the batch runs' outcome tables;
- lock_errors: runs or ticks whose error names a lock (DuckDB's single writer, the twin's
  state lock);
- lost_rows: telemetry rows neither clean nor quarantined (telemetry_ingests against the two
  tables, per partition), plus metered seconds of billed hours missing from billing;
- tick_p50_s, tick_p95_s: wall seconds of the control-loop ticks (control_loop_job runs).
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Collection
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from assets.harness.sim_daemon import simulated_daemon, simulated_instance
from market_pipeline.warehouse.scratch_database import scratch_database

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
EXECUTED = frozenset({"ok", "failed", "error", "infeasible", "running", "aborted"})  # the adapter was asked
LOCK_WORDS = ("could not set lock", "conflicting lock", "database is locked", "stayed locked", "lock on file")
BATCH_JOBS = ("drain_job", "scaling_actions_job")
CELERY_WORKERS = 2  # on the cluster profile (`[orchestration] executor = "celery"`)
REPO = Path(__file__).resolve().parents[2]
# the cluster profile's storage (dagster.cluster.yaml): PostgreSQL, pooled per process
INSTANCE_YAML = """storage:
  custom:
    module: assets.lib.pg_storage
    class: PooledPostgresStorage
    config:
      postgres_url: "{url}"
{pools}telemetry:
  enabled: false
"""
# The embedded default's one-writer `warehouse` pool; the cluster profile (a DuckLake) has none.
ONE_WRITER_POOL = """concurrency:
  pools:
    default_limit: 1
"""


@dataclass
class SoakResult:
    runs: int
    failed_runs: int
    skipped_ticks: int
    duplicate_actions: int
    lock_errors: int
    lost_rows: int
    tick_p50_s: float
    tick_p95_s: float
    simulated_hours: float
    steps: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def soak_database(admin_url: str = PG_ADMIN_URL, prefix: str = "mp_soak_") -> AbstractContextManager[str]:
    """A uniquely named PostgreSQL database (for the soak's Dagster storage, or a bench's lake
    catalog), dropped after."""
    return scratch_database(admin_url, prefix)


def run_soak(
    minutes: float,
    *,
    min_steps: int = 0,
    admin_url: str = PG_ADMIN_URL,
    logger: logging.Logger | None = None,
) -> SoakResult:
    """Soak the loop for `minutes` of wall time, and on until the daemon has taken `min_steps`
    steps, in a fresh home and database. Call it in a
    fresh process (the `bench soak` command): the runs execute here and load the definitions,
    whose resources must name this soak's home."""
    with tempfile.TemporaryDirectory(prefix="soak-") as home, soak_database(admin_url) as url:
        dagster_home = Path(home) / "dagster_home"
        dagster_home.mkdir()
        from market_pipeline.config import load_config

        lake = load_config().warehouse.backend == "ducklake"
        pools = "" if lake else ONE_WRITER_POOL
        (dagster_home / "dagster.yaml").write_text(INSTANCE_YAML.format(url=url, pools=pools))
        from market_pipeline.billing.dbt_project import environment_overrides

        celery = load_config().orchestration.executor == "celery"
        queue = f"mp_soak_{uuid.uuid4().hex[:8]}" if celery else ""
        overrides = {"MARKET_PIPELINE_HOME": home, "DAGSTER_HOME": str(dagster_home)}
        with environment_overrides(
            {**overrides, **({"MP__ORCHESTRATION__CELERY_QUEUE": queue} if celery else {})}
        ):
            with celery_workers(CELERY_WORKERS if celery else 0, dagster_home):
                return _soak(
                    minutes, min_steps, dagster_home, logger or logging.getLogger("market_pipeline.soak")
                )


@contextmanager
def celery_workers(
    count: int,
    dagster_home: Path,
    solo: bool = False,
    includes: tuple[str, ...] = (),
    name: str = "soak",
) -> Iterator[list[int]]:
    """On the cluster profile, `count` dagster-celery workers as `make cluster-up` starts them,
    on the configured queue (the soak's own: no other worker on the broker takes its steps),
    each its own process group, killed afterwards. They get this process's environment (the
    soak's home and Dagster home, the profile's MP__* settings). `solo`: each worker runs its
    steps in its own process, one at a time (Celery's solo pool; by default it forks a process
    per core); `includes`: modules a worker imports before it is ready; `name`:
    the workers' node names' stem (a name is the broker's exclusive queue of that worker: two
    live workers of one name on one host refuse each other). Yields the workers' process ids
    (each leads its process group)."""
    if count == 0:
        yield []
        return
    import json
    import os
    import signal
    import subprocess
    import sys

    from market_pipeline.config import load_config

    orchestration = load_config().orchestration
    config = dagster_home / "celery.yaml"
    executor = orchestration.celery_executor_config()
    if solo:
        # A solo worker's one loop runs the step, so it cannot answer the broker's heartbeats
        # meanwhile: after a few minutes' step the broker dropped the connection and handed the
        # unacknowledged step to the other worker, which ran it a second time. Without
        # heartbeats a dead worker is still noticed by its closed socket.
        source = executor["config_source"]
        assert isinstance(source, dict)
        executor["config_source"] = {**source, "broker_heartbeat": 0}
    config.write_text(json.dumps({"execution": {"config": executor}}))
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
    }
    workers = []
    try:
        for i in range(count):
            log = dagster_home / f"worker{i}.log"
            workers.append(
                (
                    log,
                    subprocess.Popen(
                        [
                            str(bin_dir / "dagster-celery"),
                            "worker",
                            "start",
                            "-A",
                            "dagster_celery.app",
                            "-y",
                            str(config),
                            "-n",
                            f"{name}{i}",
                            "-q",
                            orchestration.celery_queue,
                            *(arg for module in includes for arg in ("-i", module)),
                            *(["--", "--pool=solo"] if solo else []),
                        ],
                        cwd=REPO,
                        env=env,
                        stdout=log.open("w"),
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),  # fmt: skip
                )
            )
            deadline = time.monotonic() + 300  # one at a time: they share the Dagster home
            while " ready." not in log.read_text():
                if workers[-1][1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"celery worker {i} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield [proc.pid for _log, proc in workers]
    finally:
        for _log, proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def _soak(minutes: float, min_steps: int, dagster_home: Path, logger: logging.Logger) -> SoakResult:
    from market_pipeline.config import load_config
    from market_pipeline.hardware import make_adapter
    from market_pipeline.warehouse.profile import configured_warehouse

    config = load_config()
    # the daemon starts an hour into the fleet's history: every schedule's first tick then has
    # a closed hour to serve, so a skipped tick means the daemon missed one
    start = make_adapter(config).now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    instance = simulated_instance(dagster_home)
    if config.warehouse.backend != "duckdb":  # as `make cluster-up` sets it: one dbt build at a time
        from assets.billing.dbt import BILLING_DBT_POOL

        instance.event_log_storage.set_concurrency_slots(BILLING_DBT_POOL, 1)
    began = time.monotonic()
    deadline = began + minutes * 60
    steps, at = 0, start
    with simulated_daemon(instance, start, logger) as daemon:
        daemon.turn_on([schedule.name for schedule in daemon.repository().get_schedules()])  # all
        while time.monotonic() < deadline or steps < min_steps:
            upcoming = daemon.fire_times(at + timedelta(seconds=1), at + timedelta(days=1))
            at = upcoming[0]
            daemon.step(at)
            steps += 1
        fired = _fire_times(daemon, start, at)
        daemon.turn_on(())
    store = configured_warehouse(config)
    ticks = _control_tick_seconds(instance)
    return SoakResult(
        runs=instance.get_runs_count(),
        failed_runs=instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])),
        skipped_ticks=_skipped_ticks(instance, fired),
        duplicate_actions=duplicate_actions(instance),
        lock_errors=_lock_errors(instance),
        lost_rows=_lost_rows(store),
        tick_p50_s=_quantile(ticks, 0.5),
        tick_p95_s=_quantile(ticks, 0.95),
        simulated_hours=round((at - start).total_seconds() / 3600, 2),
        steps=steps,
        wall_s=round(time.monotonic() - began, 1),
    )


def _fire_times(daemon, start: datetime, end: datetime) -> dict[str, list[datetime]]:
    """Per running schedule, every fire time in (start, end]."""
    out: dict[str, list[datetime]] = {}
    for schedule in daemon.repository().get_schedules():
        times = daemon.fire_times_of(schedule, start + timedelta(seconds=1), end + timedelta(seconds=1))
        if times is not None:
            out[schedule.name] = times
    return out


def _skipped_ticks(instance: dg.DagsterInstance, fired: dict[str, list[datetime]]) -> int:
    from dagster._core.scheduler.instigation import TickStatus

    skipped = 0
    for name, times in fired.items():
        ticks = [
            t for t in instance.get_ticks(*_schedule_ids(instance, name)) if t.status == TickStatus.SUCCESS
        ]
        done = {
            datetime.fromtimestamp(t.timestamp, timezone.utc).replace(second=0, microsecond=0) for t in ticks
        }
        skipped += sum(1 for moment in times if moment not in done)
    return skipped


def _schedule_ids(instance: dg.DagsterInstance, name: str) -> tuple[str, str]:
    from dagster._core.scheduler.instigation import InstigatorType

    for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE):
        if state.instigator_name == name:
            return state.instigator_origin_id, state.selector_id
    raise LookupError(f"schedule {name} has no state")


def duplicate_actions(instance: dg.DagsterInstance, run_ids: Collection[str] | None = None) -> int:
    """Decisions two batch runs both carried out (an outcome other than skipped/superseded);
    with `run_ids`, among those runs only (one fleet's: another fleet's decision of the same id
    is another decision)."""
    executed_by: dict[str, set[str]] = {}
    for job_name in BATCH_JOBS:
        for run in instance.get_runs(dg.RunsFilter(job_name=job_name)):
            if run_ids is not None and run.run_id not in run_ids:
                continue
            for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_OUTPUT):
                table = entry.dagster_event.event_specific_data.metadata.get("outcomes")
                for record in getattr(table, "records", []) if table is not None else []:
                    row = record.data
                    if row.get("status") in EXECUTED:
                        executed_by.setdefault(str(row["decision_id"]), set()).add(run.run_id)
    return sum(1 for runs in executed_by.values() if len(runs) > 1)


def _lock_errors(instance: dg.DagsterInstance) -> int:
    count = 0
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])):
        text = " ".join(
            str(entry.dagster_event.event_specific_data)
            for entry in instance.all_logs(
                run.run_id, of_type={dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE}
            )
        )
        count += any(word in text.lower() for word in LOCK_WORDS)
    return count


def _lost_rows(store) -> int:
    """Telemetry rows neither clean nor quarantined, and metered seconds of billed hours
    that billing does not hold."""
    from market_pipeline.warehouse.readers import metered_seconds_unbilled, telemetry_rows_unaccounted

    return telemetry_rows_unaccounted(store) + metered_seconds_unbilled(store)


def _control_tick_seconds(instance: dg.DagsterInstance) -> list[float]:
    return sorted(
        record.end_time - record.start_time
        for record in instance.get_run_records(dg.RunsFilter(job_name="control_loop_job"))
        if record.start_time and record.end_time
    )


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)
