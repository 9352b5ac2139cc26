"""The Dagster daemon on the fleet's simulated clock: `make demo` and `bench soak` drive it.

The same steps `dagster-daemon run` takes (the scheduler's `launch_scheduled_runs`, the
sensor daemon's `execute_sensor_iteration`, the backfill daemon and the run queue's
`QueuedRunCoordinatorDaemon`), against the project's code location from workspace.yaml,
with Dagster's clock set to the simulated time. So every run is submitted to the instance's
run queue by its schedule, sensor or backfill, with its job's origin: the UI lists it under
that job, schedule or sensor and re-executes it as the same version.

Runs execute in this process, one at a time, through Dagster's synchronous in-memory run
launcher: the simulated day needs no wall-clock waits, and the warehouse pool's limit of
one holds trivially. The clock reads simulated time plus the wall seconds since the last
step, so a run's events keep their real durations and never run backwards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import dagster._time as dagster_time
from dagster._core import log_manager
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.controller import create_daemon_grpc_server_registry
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._daemon.sensor import execute_sensor_iteration
from dagster._scheduler.scheduler import launch_scheduled_runs
from dagster._utils.schedules import cron_string_iterator

from assets.lib.tags import tick_tags

WORKSPACE_FILE = Path(__file__).resolve().parents[2] / "workspace.yaml"
SENSOR_DELAY = timedelta(seconds=31)  # sensors tick after the schedules' runs (min interval 30 s)
BACKFILL_ITERATIONS = 20  # a backfill settles in a few daemon iterations; more means it is stuck
# The daemon process queues runs (Dagster's public QueuedRunCoordinator) and launches them
# here, in order (the synchronous in-memory launcher has no public name).
SIMULATED_DAEMON_OVERRIDES = {
    "run_coordinator": {"module": "dagster", "class": "QueuedRunCoordinator"},
    "run_launcher": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
}


class SimulatedClock:
    """Dagster's clock (dagster._time, and the run loggers' record times) set to simulated
    time: simulated moment of the last `set` plus the wall seconds since."""

    def __init__(self, start: datetime) -> None:
        self._offset = start - datetime.now(timezone.utc)

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + self._offset

    def set(self, moment: datetime) -> datetime:
        """Move to `moment` (never back: a step whose runs outlast the simulated interval
        leaves the clock where those runs ended)."""
        self._offset = max(self._offset, moment - datetime.now(timezone.utc))
        return self.now()

    @contextmanager
    def installed(self) -> Iterator[SimulatedClock]:
        clock = self
        base_manager = log_manager.DagsterLogManager

        class SimulatedTimeLogManager(base_manager):  # event records carry simulated time
            def makeRecord(self, *args, **kwargs):  # noqa: ANN002, ANN003 - logging's signature
                record = super().makeRecord(*args, **kwargs)
                record.created = clock.now().timestamp()
                record.msecs = (record.created - int(record.created)) * 1000
                return record

        base_store_check = SqlEventLogStorage.store_asset_check_event

        def store_check_on_event_time(storage: SqlEventLogStorage, event, event_id):  # noqa: ANN001
            base_store_check(storage, event, event_id)
            _check_row_on_event_time(storage, event, event_id)

        saved = (dagster_time._mockable_get_current_datetime, dagster_time._mockable_get_current_timestamp)
        dagster_time._mockable_get_current_datetime = self.now
        dagster_time._mockable_get_current_timestamp = lambda: self.now().timestamp()
        log_manager.DagsterLogManager = SimulatedTimeLogManager
        SqlEventLogStorage.store_asset_check_event = store_check_on_event_time
        try:
            yield self
        finally:
            dagster_time._mockable_get_current_datetime, dagster_time._mockable_get_current_timestamp = saved
            log_manager.DagsterLogManager = base_manager
            SqlEventLogStorage.store_asset_check_event = base_store_check


def _check_row_on_event_time(storage: SqlEventLogStorage, event, event_id: int | None) -> None:  # noqa: ANN001
    """A check execution's time (what the UI shows beside the asset's materialisations) is
    its row's `create_timestamp`, which the database stamps with its own wall clock; set it to
    the event's time, the simulated clock's, as every other event of the run carries."""
    kind = event.dagster_event_type
    if kind == dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED:
        planned = event.dagster_event.event_specific_data
        columns = AssetCheckExecutionsTable.c
        where = (
            (columns.run_id == event.run_id)
            & (columns.asset_key == planned.asset_key.to_string())
            & (columns.check_name == planned.check_name)
        )
    elif kind == dg.DagsterEventType.ASSET_CHECK_EVALUATION and not event.run_id and event_id is not None:
        where = AssetCheckExecutionsTable.c.evaluation_event_storage_id == event_id  # a runless check
    else:
        return  # the planned row of a run's check keeps the time it was planned at
    at = datetime.fromtimestamp(event.timestamp, timezone.utc).replace(
        tzinfo=None
    )  # naive UTC, as Dagster stores
    with storage.index_connection() as conn:
        conn.execute(AssetCheckExecutionsTable.update().where(where).values(create_timestamp=at))


@dataclass
class StepReport:
    at: datetime
    run_ids: list[str] = field(default_factory=list)
    seconds: float = 0.0


class SimulatedDaemon:
    """One instance, the workspace's code location, and the daemons' iterations on a clock."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        context: WorkspaceProcessContext,
        clock: SimulatedClock,
        logger: logging.Logger,
    ) -> None:
        self.instance, self.context, self.clock, self.logger = instance, context, clock, logger
        self._iteration_times: dict = {}
        self._queue = QueuedRunCoordinatorDaemon(interval_seconds=1)

    # -- the code location -------------------------------------------------------------------
    def repository(self):
        entries = self.context.create_request_context().get_code_location_entries()
        for entry in entries.values():
            if entry.load_error:
                raise RuntimeError(
                    f"code location {entry.origin.location_name} did not load: "
                    f"{entry.load_error.message.strip().splitlines()[-1]}"
                )
            for repo in entry.code_location.get_repositories().values():
                return repo
        raise RuntimeError(f"{WORKSPACE_FILE} names no code location")

    def turn_on(self, schedule_names: Sequence[str]) -> None:
        """Start these schedules (at the clock's time) and stop every other one."""
        repo = self.repository()
        known = {schedule.name for schedule in repo.get_schedules()}
        unknown = sorted(set(schedule_names) - known)
        if unknown:
            raise ValueError(f"no schedule named {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for schedule in repo.get_schedules():
            state = self.instance.get_instigator_state(schedule.get_remote_origin_id(), schedule.selector_id)
            running = schedule.get_current_instigator_state(state).is_running
            if schedule.name in schedule_names and not running:
                self.instance.start_schedule(schedule)
            elif schedule.name not in schedule_names and running:
                self.instance.stop_schedule(schedule.get_remote_origin_id(), schedule.selector_id, schedule)

    def fire_times(self, start: datetime, end: datetime) -> list[datetime]:
        """Every moment in [start, end) a running schedule's cron fires, in order."""
        moments: set[datetime] = set()
        for schedule in self.repository().get_schedules():
            moments.update(self.fire_times_of(schedule, start, end) or [])
        return sorted(moments)

    def fire_times_of(self, schedule, start: datetime, end: datetime) -> list[datetime] | None:
        """When this schedule fires in [start, end); None while it is stopped."""
        state = self.instance.get_instigator_state(schedule.get_remote_origin_id(), schedule.selector_id)
        if not schedule.get_current_instigator_state(state).is_running:
            return None
        moments = []
        for moment in cron_string_iterator(start.timestamp(), schedule.cron_schedule, "UTC"):
            if moment >= end:
                break
            moments.append(moment.astimezone(timezone.utc))
        return moments

    # -- the daemons' iterations -------------------------------------------------------------
    def step(self, at: datetime) -> StepReport:
        """What the daemon does at simulated time `at`: due schedule ticks, then the sensors,
        then the backfills; each followed by the run queue, whose runs execute here."""
        report = StepReport(at)
        before = set(self._run_ids())
        self.clock.set(at)
        list(launch_scheduled_runs(self.context, self.logger, self.clock.now(), self._iteration_times))
        self.dequeue()
        self.clock.set(at + SENSOR_DELAY)
        self.sensors()
        self.backfills()
        report.run_ids = sorted(set(self._run_ids()) - before)
        report.seconds = (self.clock.now() - at).total_seconds()
        return report

    def sensors(self) -> None:
        list(execute_sensor_iteration(self.context, self.logger, None, None))
        self.dequeue()

    def dequeue(self) -> None:
        """Launch every queued run (the launcher runs it to the end before the next)."""
        for _ in range(1000):
            if not self.instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])):
                return
            list(self._queue.run_iteration(self.context))
        raise RuntimeError("the run queue does not drain")

    def backfills(self) -> None:
        for _ in range(BACKFILL_ITERATIONS):
            if not self.instance.get_backfills(filters=_requested_backfills()):
                return
            list(execute_backfill_iteration(self.context, self.logger))
            self.dequeue()
        raise RuntimeError("a backfill did not settle; see Overview > Backfills in the Dagster UI")

    def backfill(self, job_name: str, partition_keys: Sequence[str], *, title: str) -> str:
        """Request a backfill of the job over these partitions, as the UI's job "Backfill"
        does; the next step's backfill daemon runs it. A job backfill runs the job's whole
        selection, in one ranged run where every asset's backfill policy is single-run. (An
        asset backfill would hold back each asset with an ancestor in the range reached
        through assets outside it: the dbt models on the price book, which the market tick
        derives from metering.)"""
        repo = self.repository()
        partition_set = next((ps for ps in repo.get_partition_sets() if ps.job_name == job_name), None)
        if partition_set is None:
            raise ValueError(f"job {job_name} has no partitions to backfill")
        backfill_id = f"{title}-{self.clock.now():%Y%m%dT%H%M%S}".replace(" ", "-")
        self.instance.add_backfill(
            PartitionBackfill(
                backfill_id=backfill_id,
                status=BulkActionStatus.REQUESTED,
                from_failure=False,
                tags=tick_tags(self.clock.now()),
                backfill_timestamp=self.clock.now().timestamp(),
                partition_set_origin=partition_set.get_remote_origin(),
                partition_names=list(partition_keys),
                title=title,
                description=f"{len(partition_keys)} hourly partitions, {partition_keys[0]} .. "
                f"{partition_keys[-1]}",
            )
        )
        return backfill_id

    def _run_ids(self) -> list[str]:
        return list(self.instance.get_run_ids())


def _requested_backfills() -> BulkActionsFilter:
    return BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED])


def simulated_instance(dagster_home: Path) -> dg.DagsterInstance:
    """The instance of `dagster_home` (its storage: SQLite or PostgreSQL), with the run queue
    and an in-process launcher for the simulated daemon."""
    return dg.DagsterInstance.from_ref(
        InstanceRef.from_dir(str(dagster_home), overrides=SIMULATED_DAEMON_OVERRIDES)
    )


@contextmanager
def simulated_daemon(
    instance: dg.DagsterInstance, start: datetime, logger: logging.Logger | None = None
) -> Iterator[SimulatedDaemon]:
    """The workspace's code location served as the daemon serves it (a gRPC code server),
    and Dagster's clock at `start`."""
    logger = logger or logging.getLogger("market_pipeline.sim_daemon")
    clock = SimulatedClock(start)
    with ExitStack() as stack:
        stack.enter_context(clock.installed())
        registry = stack.enter_context(create_daemon_grpc_server_registry(instance))
        context = stack.enter_context(
            WorkspaceProcessContext(
                instance, WorkspaceFileTarget(paths=[str(WORKSPACE_FILE)]), grpc_server_registry=registry
            )
        )
        yield SimulatedDaemon(instance, context, clock, logger)
