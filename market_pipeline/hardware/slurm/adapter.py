"""`slurm` backend: the node hardware adapter over a Slurm cluster, every operation a Slurm action.

| operation | Slurm |
|---|---|
| list_nodes / list_gpus | `sinfo --json`: GRES type -> model, `zone_<zone>` feature -> zone, GPU = node + GRES index |
| list_tasks | `squeue --json`, RUNNING jobs: node, GPUs (GRES IDX), tenant = account, start, class |
| pending_summary | `squeue --json`, jobs PENDING for capacity (reason `Resources`, `Priority`, ...): GPUs asked (`tres_per_node`/`tres_per_job`) per GRES type -> model, class, wait |
| waiting_guaranteed | the same guaranteed jobs, oldest first, one waiting task per node asked: what the live drain planner makes room for |
| close_to_drainable | `scontrol update jobid=J StartTime=...`: pending drainable jobs of a GPU model where guaranteed work waits start no sooner than one lease ahead (rule 4 of the rigid guarantee); the closure published next to slurm.conf for the shipped job_submit plugin (`job_submit.lua`), which gives a drainable job submitted in between the same begin time |
| guaranteed_arrivals | `squeue --json` guaranteed jobs by submission, and the journal's runs of those squeue forgot: what rule 5's forecast of guaranteed arrivals reads |
| keep_drainable_off | `scontrol update PartitionName=<drainable> Nodes=...`: the nodes kept for guaranteed arrivals (rule 5's room for the forecast arrivals, rule 6's empty nodes and those refilling them) leave the drainable partition's list, and go back when no longer kept |
| read_samples | per-GPU allocation (the jobs' GRES indices, `gres_used`), logged at each read |
| cordon / uncordon | `scontrol update nodename=N state=drain reason=...` / `state=resume` |
| warn_task / checkpoint_task | `scancel --signal=USR1 --batch` / `--signal=USR2 --batch` |
| terminate_task / kill_task | `scancel` (TERM, KILL after the cluster's `KillWait`) / `scancel --signal=KILL --full` |
| verify_released | the run is gone and no job holds its GPUs (`gres_used`), polled up to a deadline |
| power_off / power_on | `state=power_down_asap` / `state=power_up` (SuspendProgram / ResumeProgram) |
| requeue_task | `scontrol requeue`: a drained checkpointable job runs again, from its checkpoint |

A task is one run of a job: `<job id>@<start unix seconds>`, so a requeued job's runs are
metered apart. Ended runs come from slurmdbd (`sacct --json --duplicates`, a bounded window,
with each job's GPUs from its TRES `gres/gpu`) where the cluster has accounting storage, else
from the job completion log (`jobcomp/filetxt`). The tenant of a job is its Slurm account;
with slurmdbd (`AccountingStorageEnforce=associations`) a job of an unknown account is
refused at submission, without it the account is a free string. Drainable work: jobs in the partition (or QOS) `adapter.slurm_drainable`.
Checkpointable: jobs submitted with `--requeue`. A job declares its USR1/USR2 handlers by
setting `checkpoint=0` in its comment (`scontrol update jobid=$SLURM_JOB_ID comment=...`)
once they are installed, and acknowledges each checkpoint by counting it up; a job that has
not declared them gets no USR1/USR2 (their default action kills), only the scancel notice.
Nodes in a state the adapter does not know (DOWN, FAIL, NOT_RESPONDING, ...) are listed
as cordoned and OFF with the reason, and no operation acts on them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from market_pipeline.hardware.naming import DeviceModelNamer, identity_namer, pool_id
from market_pipeline.hardware.protocol import (
    PENDING_FIELDS,
    TASK_EVENT_SCHEMA,
    DrainableClosure,
    DrainableKeptOff,
    GpuInfo,
    GuaranteedArrival,
    NodeInfo,
    NodeState,
    Outcome,
    OutcomeStatus,
    ResourceClass,
    TaskInfo,
    TaskKind,
    WaitingTask,
)
from market_pipeline.hardware.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNotFound,
    SlurmTimeout,
    SlurmUnavailable,
)
from market_pipeline.hardware.slurm.cluster import LocalCluster
from market_pipeline.hardware.slurm.journal import Journal
from market_pipeline.hardware.slurm.parse import (
    JobRun,
    SlurmJob,
    SlurmNode,
    gpu_id,
    parse_config,
    parse_jobcomp,
    parse_nodes,
    parse_sacct,
    parse_squeue,
)
from market_pipeline.hardware.slurm.samples import SampleLog

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

CORDON_REASON = "market-pipeline cordon"
POWER_REASON = "market-pipeline scale-down"
MAX_JOBCOMP_BYTES = 256 * 1024 * 1024
# job completion states -> task event (a run our drain ended is `drained` whatever its state)
FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
EVENT_ORDER = {"start": 0, "drain_signal": 1, "drained": 2, "end": 2, "failed": 2}
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "PREEMPTED", "REQUEUE_HOLD", "REQUEUE_FED"})
# pending drainable jobs one rule 4 pass acts on (one scontrol each): the oldest first
MAX_DEFERRALS = 256
# rule 4's closure, published next to slurm.conf for the job_submit plugin (job_submit.lua)
CLOSURE_FILE = "market-pipeline-closure"
# a begin time within this of the one we gave a job is still ours (Slurm keeps whole seconds)
BEGIN_SLACK_SECONDS = 2.0


def task_id_of(job: SlurmJob | JobRun) -> str:
    start = job.start_time if isinstance(job, SlurmJob) else job.start
    return f"{job.job_id}@{int(start.timestamp()) if start else 0}"


def split_task_id(task_id: str) -> tuple[str, int | None]:
    job, _, start = task_id.partition("@")
    return job, int(start) if start.isdigit() else None


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat()


class SlurmAdapter:
    backend = "slurm"
    # Slurm knows which GPU a job holds, not what it draws: these stay null in its samples
    unmeasured_sample_fields = frozenset({"mem_used_mib", "power_w", "temp_c"})

    def __init__(
        self,
        client: SlurmClient,
        journal_path: Path,
        *,
        namer: Callable[[str], str] = identity_namer,
        memory_mib: dict[str, int] | None = None,
        drainable: str = "drainable",
        default_zone: str = "local",
        operation_timeout_seconds: float = 10.0,
        poll_seconds: float = 0.25,
        sample_interval_seconds: float = 60.0,
    ) -> None:
        self.client = client
        self.journal = Journal(journal_path)
        self.samples = SampleLog(journal_path.with_suffix(".samples.jsonl"), sample_interval_seconds)
        self.namer = namer
        self.memory_mib = memory_mib or {}
        self.drainable = drainable
        self.default_zone = default_zone
        self.operation_timeout_seconds = operation_timeout_seconds
        self.poll_seconds = poll_seconds
        self._slurm_config: dict[str, str] | None = None  # `scontrol show config`, read once

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "SlurmAdapter":
        adapter = config.adapter
        state = config.resolve_path(adapter.state_path)
        conf = config.resolve_path(adapter.slurm_conf) if adapter.slurm_conf else None
        return cls(
            SlurmClient(conf, timeout_seconds=adapter.operation_timeout_seconds),
            state.with_name(state.stem + ".slurm.json"),
            namer=DeviceModelNamer.from_config(config),
            memory_mib={m.name: m.memory_mib for m in config.gpu_models},
            drainable=adapter.slurm_drainable,
            default_zone=adapter.zone,
            operation_timeout_seconds=adapter.operation_timeout_seconds,
            sample_interval_seconds=config.loop.sample_interval_seconds,
        )

    @classmethod
    def for_cluster(
        cls, cluster: LocalCluster, config: MarketPipelineConfig, poll_seconds: float = 0.1
    ) -> "SlurmAdapter":
        """The adapter of a local test cluster (its journal and samples under its home)."""
        return cls(
            cluster.client(),
            cluster.home / "journal.json",
            namer=DeviceModelNamer.from_config(config),
            memory_mib={m.name: m.memory_mib for m in config.gpu_models},
            drainable=config.adapter.slurm_drainable,
            operation_timeout_seconds=config.adapter.operation_timeout_seconds,
            poll_seconds=poll_seconds,
        )

    # -- reads --------------------------------------------------------------------------------
    def slurm_nodes(self) -> list[SlurmNode]:
        return parse_nodes(self.client.sinfo_nodes())

    def slurm_jobs(self) -> list[SlurmJob]:
        return parse_squeue(self.client.squeue_jobs())

    def node_conditions(self) -> dict[str, str]:
        """Nodes in a state the adapter does not act on, with the state and reason."""
        return {n.name: c for n in self.slurm_nodes() if (c := n.unknown_condition) is not None}

    def _model(self, node: SlurmNode) -> str:
        return self.namer(node.gpu_type) if node.gpu_type else ""

    def _zone(self, node: SlurmNode) -> str:
        return node.zone or self.default_zone

    def list_nodes(self) -> list[NodeInfo]:
        out = []
        for node in self.slurm_nodes():
            if node.gpus == 0:
                continue
            unknown = node.unknown_condition is not None
            if node.powered_off or unknown:
                state = NodeState.OFF
            elif node.powering_up:
                state = NodeState.WARM
            else:
                state = NodeState.ON
            model, zone = self._model(node), self._zone(node)
            out.append(
                NodeInfo(
                    node.name, pool_id(model, zone), model, zone, node.gpus, state, node.drained or unknown
                )
            )
        return out

    def list_gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(gpu_id(n.name, i), n.name, i, self._model(n), self.memory_mib.get(self._model(n), 0))
            for n in self.slurm_nodes()
            for i in range(n.gpus)
        ]

    def _task(self, job: SlurmJob, pools: dict[str, str]) -> TaskInfo:
        drainable = self.drainable in {job.partition, job.qos}
        kind = job.comment.get("kind", TaskKind.TRAINING.value)
        model = self.namer(job.gpu_type) if job.gpu_type else ""
        return TaskInfo(
            task_id=task_id_of(job),
            tenant_id=job.account,
            pool_id=pools.get(job.node) or pool_id(model, self.default_zone),
            node_id=job.node,
            gpu_uuids=job.gpu_ids,
            gpu_milli=1000,
            kind=TaskKind(kind) if kind in {k.value for k in TaskKind} else TaskKind.TRAINING,
            qos="BE" if drainable else "LS",
            priority=0 if drainable else 2,
            resource_class=ResourceClass.DRAINABLE if drainable else ResourceClass.GUARANTEED,
            started_at=job.start_time or datetime.now(timezone.utc),
            checkpointable=job.requeue,
        )

    def _read(self) -> tuple[list[SlurmNode], list[TaskInfo]]:
        """The GPU nodes and the running tasks (remembered for metering)."""
        nodes = [n for n in self.slurm_nodes() if n.gpus]
        pools = {n.name: pool_id(self._model(n), self._zone(n)) for n in nodes}
        jobs = [j for j in self.slurm_jobs() if j.state == "RUNNING" and j.gpu_indices and j.start_time]
        tasks = sorted((self._task(j, pools) for j in jobs), key=lambda t: t.task_id)
        self._remember(tasks)
        return nodes, tasks

    def list_tasks(self) -> list[TaskInfo]:
        """Running jobs (each run a task) that hold GPUs; the GPUs' allocation is logged as
        samples at most once per sample interval."""
        nodes, tasks = self._read()
        now = datetime.now(timezone.utc)
        if self.samples.due(now):
            self.samples.append(self._allocation(nodes, tasks, now))
        return tasks

    def pending_summary(self) -> dict[str, dict[str, float]]:
        """Jobs waiting for GPUs (pending for capacity, asking for some), per GPU model, in the rows the
        simulated fleet's queue reports (`FleetTwinAdapter.pending_summary`): the count and
        GPUs asked, the guaranteed jobs, their GPUs and longest wait (seconds since submission),
        and the GPUs drainable tasks hold on that model. What the fleet inventory records per
        pool: the pending demand, the rigid guarantee's check and what it can back
        (`tick.promises.guarantee_reach`). A job held, or waiting on a dependency, a begin
        time or its account's limits, is no demand waiting for capacity and is left out; the
        model as `_waiting_for_gpus` reads it."""
        nodes, tasks = self._read()
        now = datetime.now(timezone.utc)
        out: dict[str, dict[str, float]] = {}
        for job, model in self._waiting_for_gpus(nodes):
            row = out.setdefault(model, dict.fromkeys(PENDING_FIELDS, 0.0))
            row["jobs"] += 1
            row["gpus"] += job.requested_gpus
            if self.drainable not in {job.partition, job.qos}:
                waited = (now - job.submit_time).total_seconds() if job.submit_time else 0.0
                row["guaranteed_jobs"] += 1
                row["guaranteed_gpus"] += job.requested_gpus
                row["guaranteed_oldest_wait_s"] = max(row["guaranteed_oldest_wait_s"], waited)
        model_of = {n.name: self._model(n) for n in nodes}
        for task in tasks:
            model = model_of.get(task.node_id)
            if task.resource_class == ResourceClass.DRAINABLE and model in out:
                out[model]["drainable_running_gpus"] += task.gpus
        return out

    def waiting_guaranteed(self, limit: int = 64) -> list[WaitingTask]:
        """The guaranteed jobs pending for capacity, oldest submission first (at most `limit`
        tasks): what the live drain planner makes room for (`drain.triggers.GuaranteedWaiting`),
        as the simulated fleet's queue reports its own. A job asking for several nodes is one
        waiting task per node (`<job id>#<k>`), each asking the job's GPUs per node
        (`tres_per_job` spread evenly, rounded up), so that the planner makes room on as many
        nodes. Slurm has no GPU fraction (each asks whole GPUs), and CPU and memory are not
        read: the live room search counts GPU room only. The model as in `pending_summary`."""
        now = datetime.now(timezone.utc)
        rigid = [
            (job, model)
            for job, model in self._waiting_for_gpus([n for n in self.slurm_nodes() if n.gpus])
            if self.drainable not in {job.partition, job.qos}
        ]
        rigid.sort(key=lambda jm: (jm[0].submit_time or now, _job_number(jm[0].job_id)))
        out: list[WaitingTask] = []
        for job, model in rigid:
            per_node = -(-job.requested_gpus // job.requested_nodes)
            for k in range(job.requested_nodes):
                if len(out) >= max(limit, 0):
                    return out
                out.append(
                    WaitingTask(
                        task_id=job.job_id if job.requested_nodes == 1 else f"{job.job_id}#{k}",
                        tenant_id=job.account,
                        gpu_model=model,
                        num_gpu=per_node,
                        gpu_milli=1000,
                        mem_mib=0,
                        waiting_since=job.submit_time or now,
                    )
                )
        return out

    def guaranteed_arrivals(self, since: datetime) -> list[GuaranteedArrival]:
        """The guaranteed jobs that arrived since `since`, the earliest first: what rule 5's
        forecast reads (`drain.queue_rules.keep_off_drainable`). Those squeue still lists (pending,
        running, or ended within the cluster's `MinJobAge`) at their submission; those it no
        longer lists at the start of the run the journal saw (Slurm forgets an ended job, the
        journal keeps its runs): a short job submitted and ended between two reads is missed.
        One arrival per job, asking its GPUs per node (`tres_per_job` spread evenly, rounded
        up) on each node it asks for; the model as `pending_summary` reads it."""
        nodes = [n for n in self.slurm_nodes() if n.gpus]
        jobs = self.slurm_jobs()
        listed = {j.job_id for j in jobs}
        out: dict[str, GuaranteedArrival] = {}
        for job, model in self._asking_gpus(nodes, jobs):
            if (
                self.drainable in {job.partition, job.qos}
                or job.submit_time is None
                or job.submit_time < since
            ):
                continue
            per_node = -(-job.requested_gpus // max(job.requested_nodes, 1))
            out[job.job_id] = GuaranteedArrival(
                job.job_id, job.submit_time, model, per_node, max(job.requested_nodes, 1)
            )
        model_of = {n.name: self._model(n) for n in nodes}
        for record in self.journal.read()["runs"].values():
            job_id = split_task_id(record["task_id"])[0]
            if (
                record["resource_class"] != ResourceClass.GUARANTEED.value
                or job_id in listed
                or job_id in out
            ):
                continue
            started = datetime.fromisoformat(record["started_at"])
            if started >= since and record["gpu_uuids"]:
                out[job_id] = GuaranteedArrival(
                    job_id, started, model_of.get(record["node_id"], ""), len(record["gpu_uuids"])
                )
        return sorted(out.values(), key=lambda a: (a.arrived_at, _job_number(a.job_id)))

    def _waiting_for_gpus(self, nodes: Sequence[SlurmNode]) -> list[tuple[SlurmJob, str]]:
        """(job, GPU model) of each job pending for capacity (`SlurmJob.waits_for_capacity`)
        that asks for GPUs, and of each drainable job our rule 4 pass deferred, or the
        job_submit plugin did at submission (it waits for the guaranteed backlog of its model:
        still demand). A request naming no GRES type
        counts for the model the cluster's GPU nodes share; where they have several, it is left
        out (nothing says which model's queue it is in)."""
        journal = self.journal.read()
        deferred, published = journal["deferred"], journal["published_until"]

        def ours(job: SlurmJob) -> bool:  # our pass's deferral, or the job_submit plugin's
            if job.job_id in deferred:
                return True
            return (
                bool(published) and self.drainable in {job.partition, job.qos} and _begins_at(job, published)
            )

        return [
            (job, model)
            for job, model in self._asking_gpus(nodes)
            if job.waits_for_capacity or (job.state == "PENDING" and ours(job))
        ]

    def _asking_gpus(
        self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob] | None = None
    ) -> list[tuple[SlurmJob, str]]:
        """(job, GPU model) of each job (of `jobs`, else squeue's) that asks for GPUs, the
        model as `_waiting_for_gpus` reads it."""
        models = {self._model(n) for n in nodes}
        only = next(iter(models)) if len(models) == 1 else None
        out = []
        for job in self.slurm_jobs() if jobs is None else jobs:
            if job.requested_gpus <= 0:
                continue
            model = self.namer(job.requested_gpu_type) if job.requested_gpu_type else only
            if model:
                out.append((job, model))
        return out

    def close_to_drainable(
        self, models: Collection[str], lease_seconds: float, *, act: bool = True
    ) -> DrainableClosure:
        """Rule 4 of the rigid guarantee on Slurm's own queue: while guaranteed work waits for
        capacity on a GPU model (`models`), drainable work is not started there. Slurm's
        backfill hands room freed piecemeal (one GPU of a node a waiting guaranteed job needs
        whole) to whatever pending job fits it, a drainable one included, whatever the
        partitions' priority tiers say: each pending drainable job asking for such a model
        gets a begin time one lease ahead (`scontrol update StartTime=`), renewed every pass
        while the model stays closed. Where the model opened, the jobs this rule deferred get
        their begin time back (now). A lease, not a hold: if the control loop stops, every
        deferral lapses within one lease.

        Only our own deferrals are renewed or undone (the journal): a job held by its tenant,
        waiting on a dependency or on a begin time its tenant set, or whose begin time was
        changed since, is left alone; a begin time the job_submit plugin gave at submission
        (`job_submit.lua`: the lease end this pass publishes next to slurm.conf,
        `closure_file`) is ours. A drainable job naming no GRES type on a cluster of
        several GPU models is not deferred (nothing says which model it lands on). At most
        `MAX_DEFERRALS` jobs are acted on a pass, the oldest first. `act` False (shadow mode):
        nothing is changed, and `deferred` lists the jobs that would have been."""
        now = datetime.now(timezone.utc)
        closed = frozenset(models)
        journal = self.journal.read()
        ours: dict[str, str] = journal["deferred"]
        published = journal["published_until"]  # the lease the job_submit plugin gave new jobs
        nodes = [n for n in self.slurm_nodes() if n.gpus]
        defer, release, changed = [], [], set()
        for job, model in self._asking_gpus(nodes):
            if job.state != "PENDING" or self.drainable not in {job.partition, job.qos}:
                continue
            mine = job.job_id in ours and _begins_at(job, ours[job.job_id])
            mine = mine or (job.job_id not in ours and bool(published) and _begins_at(job, published))
            if job.job_id in ours and not mine:
                changed.add(job.job_id)  # its begin time was set since: no longer ours
            if model in closed and (mine or job.waits_for_capacity):
                defer.append(job)
            elif mine:
                release.append(job)
        defer.sort(key=lambda j: (j.submit_time or now, _job_number(j.job_id)))
        defer = defer[:MAX_DEFERRALS]
        if not act:
            return DrainableClosure(tuple(sorted(closed)), tuple(j.job_id for j in defer))
        until = now + timedelta(seconds=lease_seconds)
        done: dict[str, str] = {}
        released, failed = [], []
        types = sorted({n.gpu_type for n in nodes if self._model(n) in closed})
        try:
            self._publish_closure(until, types)
        except OSError as exc:
            failed.append(f"closure file: {exc}")
        for job, moment in [(j, until) for j in defer] + [(j, now) for j in release]:
            try:
                self.client.set_begin(job.job_id, moment)
            except SlurmUnavailable:
                raise
            except SlurmError as exc:  # it started, ended or was cancelled since the read
                failed.append(f"{job.job_id}: {exc}")
                continue
            if moment is until:
                done[job.job_id] = _slurm_second(until).isoformat()
            else:
                released.append(job.job_id)
        pending = {j.job_id for j in self.slurm_jobs() if j.state == "PENDING"}
        with self.journal.edit() as edited:
            acted = {j.job_id for j in defer} | set(released) | changed
            kept = {k: v for k, v in edited["deferred"].items() if k in pending and k not in acted}
            edited["deferred"] = kept | done
            edited["published_until"] = _slurm_second(until).isoformat() if types else ""
        return DrainableClosure(tuple(sorted(closed)), tuple(done), tuple(released), tuple(failed))

    @property
    def closure_file(self) -> Path:
        """Where rule 4's closure is published for the job_submit plugin (`job_submit.lua`):
        `market-pipeline-closure` next to slurm.conf, where the plugin looks for it."""
        conf = self.client.conf or Path("/etc/slurm/slurm.conf")
        return Path(conf).parent / CLOSURE_FILE

    def _publish_closure(self, until: datetime, gres_types: Sequence[str]) -> None:
        """The closure the job_submit plugin reads (`job_submit.lua`): until when, the drainable
        class and the GRES types closed. Atomic; with no type closed, the lease is void at once."""
        lease_end = int(_slurm_second(until).timestamp()) if gres_types else 0
        lines = [f"until {lease_end}", f"class {self.drainable}", *(f"type {t}" for t in gres_types)]
        target = self.closure_file
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, target)

    def keep_drainable_off(self, node_ids: Collection[str], *, act: bool = True) -> DrainableKeptOff:
        """Rules 5 and 6 of the rigid guarantee on Slurm's own queue: the nodes the policy keeps
        from new drainable work (`drain.service.keep_off_drainable`: the empty largest nodes kept
        for whole-node guaranteed work and those refilling them) leave the drainable
        partition's node list (`scontrol update PartitionName=<drainable> Nodes=...`). No
        pending or newly submitted drainable job starts there, the drainable jobs running there
        run on, and the guaranteed partition keeps the nodes. Nodes no longer kept go back;
        with none kept, the partition's list as found (`Nodes=ALL` here) is restored. One
        command a pass, and only when the list changes.

        Why the partition and not each pending job (rule 4's begin times): a kept node is
        there for the guaranteed job not yet submitted, and the drainable job submitted between
        two passes is the one that would take it; the partition's list keeps it off at
        submission. Only our own change is undone: the journal keeps the list as found and the
        one we set, and where the partition's list is no longer the one we set (an operator's
        update, `scontrol reconfigure`), theirs is taken as found and nothing of ours is put
        back. Each GPU model keeps one of its largest nodes in the list whatever is asked: a
        partition with no node that could run a job refuses it at submission. Where drainable
        work is a QOS, not a partition, nothing is applied and `refused` says so. Not a lease: while the loop is stopped the kept nodes stay off drainable work;
        turning the rules off (`empty_nodes_kept` 0) gives them back at the next pass. `act`
        False (shadow mode): `kept` lists what would be kept off and nothing is kept; what an
        earlier pass kept is given back (the list as found), so that a loop switched to shadow
        mode leaves the cluster as it found it."""
        part = self.drainable
        try:
            found = self.client.partition_nodes(part)
        except SlurmUnavailable:
            raise
        except SlurmNotFound:
            return DrainableKeptOff(
                refused=f"drainable work is not a Slurm partition (no partition {part}): "
                "no node is kept from it"
            )
        nodes = self.slurm_nodes()
        order = [n.name for n in nodes]
        members = {n.name for n in nodes if part in n.partitions}
        ours: dict[str, Any] = self.journal.read()["kept_off"]
        if ours and ours.get("applied") != found:
            ours = {}  # the list was changed since by someone else: theirs is the definition now
        removed = set(ours.get("removed", ())) & set(order)  # a node gone from the cluster is not given back
        base = members | removed  # the partition's nodes, ours given back
        asked = set(node_ids) & base
        # per GPU model, one of its largest nodes stays in the list: sbatch refuses a job its
        # partition could never run, and a pending job its partition cannot hold no longer
        # waits for capacity (squeue's reason turns to the partition's configuration)
        largest: dict[str, list[SlurmNode]] = {}
        for node in nodes:
            if node.gpus and node.name in base:
                group = largest.setdefault(self._model(node), [])
                if group and node.gpus > group[0].gpus:
                    group.clear()
                if not group or node.gpus == group[0].gpus:
                    group.append(node)
        for group in largest.values():
            if all(n.name in asked for n in group):
                asked.discard(group[-1].name)
        would_keep = [n for n in order if n in asked]
        kept = would_keep if act else []  # shadow mode: what an earlier acting pass kept goes back
        returned = [n for n in order if n in removed and n not in kept]
        remaining = [n for n in order if n in base and n not in kept]
        try:
            if kept:
                applied = found
                if set(remaining) != members:
                    self.client.set_partition_nodes(part, ",".join(remaining))
                    applied = self.client.partition_nodes(part)
                state = {"found": ours.get("found", found), "applied": applied, "removed": kept}
            else:
                if ours:
                    self.client.set_partition_nodes(part, ours["found"])
                state = {}
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            return DrainableKeptOff(refused=str(exc))
        with self.journal.edit() as journal:
            journal["kept_off"] = state
        return DrainableKeptOff(tuple(would_keep), tuple(returned))

    def _remember(self, tasks: Sequence[TaskInfo]) -> None:
        with self.journal.edit() as journal:
            runs = journal["runs"]
            for t in tasks:
                if t.task_id not in runs:
                    runs[t.task_id] = {
                        "task_id": t.task_id,
                        "tenant_id": t.tenant_id,
                        "pool_id": t.pool_id,
                        "node_id": t.node_id,
                        "gpu_uuids": list(t.gpu_uuids),
                        "kind": t.kind.value,
                        "qos": t.qos,
                        "priority": t.priority,
                        "resource_class": t.resource_class.value,
                        "started_at": _iso(t.started_at),
                        "checkpointable": t.checkpointable,
                    }

    def task_catalog(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        runs = self.journal.read()["runs"]
        return [_task_from_record(runs[t]) for t in task_ids if t in runs]

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        """Per-GPU allocation samples in [start, end): those logged by earlier reads, plus
        one taken now when now is in the window. Slurm measures allocation, not utilisation:
        `sm_util_pct` is 100 on a GPU a job holds and 0 on a free one; memory used, power and
        temperature stay null (not measured)."""
        now = datetime.now(timezone.utc)
        if start <= now < end:
            nodes, tasks = self._read()
            self.samples.append(self._allocation(nodes, tasks, now))
        return self.samples.read(start, end)

    def _allocation(self, nodes: Sequence[SlurmNode], tasks: Sequence[TaskInfo], now: datetime) -> list[dict]:
        holders = {g: t for t in tasks for g in t.gpu_uuids}
        rows = []
        for node in nodes:
            memory = float(self.memory_mib.get(self._model(node), 0))
            for i in range(node.gpus):
                gid = gpu_id(node.name, i)
                task = holders.get(gid)
                busy = task is not None or i in node.used_indices
                rows.append(
                    {
                        "ts": now,
                        "node_id": node.name,
                        "gpu_uuid": gid,
                        "gpu_index": i,
                        "sm_util_pct": 100.0 if busy else 0.0,
                        "mem_used_mib": None,
                        "mem_total_mib": memory,
                        "power_w": None,
                        "temp_c": None,
                        "mig_profile": None,
                        "task_id": task.task_id if task else None,
                        "tenant_id": task.tenant_id if task else None,
                        "xid_errors": 0,
                    }
                )
        return rows

    def slurm_config(self) -> dict[str, str]:
        """`scontrol show config`, read once (the plugins do not change while slurmctld runs)."""
        if self._slurm_config is None:
            self._slurm_config = parse_config(self.client.run(["scontrol", "show", "config"]))
        return self._slurm_config

    @property
    def accounting(self) -> bool:
        """Whether the cluster records jobs in slurmdbd (`sacct`, `sacctmgr` answer)."""
        return self.slurm_config().get("AccountingStorageType") == "accounting_storage/slurmdbd"

    def accounts(self) -> list[str]:
        """The Slurm accounts (tenants) slurmdbd knows; none without accounting storage."""
        return self.client.accounts() if self.accounting else []

    def ended_runs(self, start: datetime, end: datetime) -> list[JobRun]:
        """Runs that ended, of jobs that ran in [start, end): slurmdbd's record where there is
        one (with each run's GPUs), else the whole job completion log."""
        if self.accounting:
            return parse_sacct(self.client.sacct_jobs(start, end))
        return self.jobcomp_runs()

    def jobcomp_runs(self) -> list[JobRun]:
        """Every ended run in the job completion log (`JobCompType=jobcomp/filetxt`)."""
        path = self._jobcomp()
        if path is None:
            return []
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_JOBCOMP_BYTES)
        except FileNotFoundError:
            return []
        return parse_jobcomp(data.decode(errors="replace").splitlines())

    def _jobcomp(self) -> Path | None:
        config = self.slurm_config()
        kind, loc = config.get("JobCompType", ""), config.get("JobCompLoc", "")
        return Path(loc) if kind == "jobcomp/filetxt" and loc else None

    def read_task_events(self, start: datetime, end: datetime) -> pl.DataFrame:
        """start/end/drained/failed of every run seen running (from its start and the job
        completion log), and the drain warnings this adapter sent. The log keeps whole
        seconds: a warning in a run's last second is stamped just before the run's end, so
        that it belongs to the run (billing's grace starts there)."""
        tasks = self.list_tasks()
        journal = self.journal.read()
        known = journal["runs"]
        rows: list[dict[str, Any]] = []
        for t in tasks:
            rows.append(_event(t.started_at, t.task_id, "start", "running"))
        ended: dict[str, datetime] = {}
        for run in self.ended_runs(start, end):
            tid = task_id_of(run)
            if tid not in known:
                continue
            ended[tid] = run.end
            rows.append(_event(run.start, tid, "start", ""))
            if tid in journal["drained"]:
                rows.append(_event(run.end, tid, "drained", journal["drained"][tid]))
            elif run.state in FAILED_STATES:
                rows.append(_event(run.end, tid, "failed", run.state, run.state == "NODE_FAIL"))
            elif run.state in REQUEUED_STATES:
                rows.append(_event(run.end, tid, "drained", f"requeued ({run.state})"))
            else:
                rows.append(_event(run.end, tid, "end", run.state))
        for tid, ts in journal["drain_signals"].items():
            signal = datetime.fromisoformat(ts)
            end_of_run = ended.get(tid)
            if end_of_run is not None and signal >= end_of_run:
                signal = end_of_run - timedelta(microseconds=1)  # inside the run's last second
            rows.append(_event(signal, tid, "drain_signal", "warning sent"))
        frame = pl.DataFrame(rows, schema=TASK_EVENT_SCHEMA).unique(["task_id", "event"], keep="first")
        order = pl.col("event").replace_strict(EVENT_ORDER, default=9, return_dtype=pl.Int8)
        return (
            frame.filter((pl.col("ts") >= start) & (pl.col("ts") < end))
            .with_columns(order.alias("_order"))
            .sort("ts", "_order", "task_id")
            .drop("_order")
        )

    # -- drain operations -----------------------------------------------------------------------
    def _running(self, task_id: str) -> SlurmJob | Outcome:
        """The running job of this task (this run), or the outcome saying why not."""
        job_id, start = split_task_id(task_id)
        try:
            jobs = [j for j in self.slurm_jobs() if j.job_id == job_id]
        except SlurmError as exc:
            return _error_outcome(exc)
        if not jobs or jobs[0].state != "RUNNING":
            state = jobs[0].state if jobs else "gone"
            return Outcome(OutcomeStatus.GONE, f"job {job_id} is not running ({state})")
        job = jobs[0]
        if start is not None and job.start_time and int(job.start_time.timestamp()) != start:
            return Outcome(
                OutcomeStatus.GONE, f"run {task_id} ended; job {job_id} runs again since {job.start_time}"
            )
        return job

    def _act(self, action: Callable[[], None], done: str, started: float) -> Outcome:
        try:
            action()
        except SlurmError as exc:
            return _error_outcome(exc, time.monotonic() - started)
        return Outcome.success(done, time.monotonic() - started)

    def warn_task(self, task_id: str, deadline_seconds: float) -> Outcome:
        started = time.monotonic()
        job = self._running(task_id)
        if isinstance(job, Outcome):
            return job
        with self.journal.edit() as journal:
            journal["drain_signals"].setdefault(task_id, _iso(datetime.now(timezone.utc)))
        if "checkpoint" not in job.comment:
            # USR1's default action kills: only a job that declared its handlers gets it
            return Outcome(
                OutcomeStatus.UNSUPPORTED,
                f"job {job.job_id} declares no signal handlers (comment checkpoint=): notice recorded, not signalled",
                time.monotonic() - started,
            )
        return self._act(
            lambda: self.client.signal_job(job.job_id, "USR1"),
            f"SIGUSR1 to job {job.job_id}: drain in {deadline_seconds:.0f}s",
            started,
        )

    def checkpoint_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        """USR2 to the batch script; done when the job acknowledges a new checkpoint in its
        comment (`checkpoint=<n>`)."""
        started = time.monotonic()
        job = self._running(task_id)
        if isinstance(job, Outcome):
            return job
        if not job.requeue or "checkpoint" not in job.comment:
            return Outcome(OutcomeStatus.UNSUPPORTED, f"job {job.job_id} declares no checkpoint (comment)")
        before = job.comment.get("checkpoint")
        sent = self._act(lambda: self.client.signal_job(job.job_id, "USR2"), "", started)
        if not sent.ok:
            return sent
        deadline = started + timeout_seconds
        while time.monotonic() < deadline:
            now = self._running(task_id)
            if isinstance(now, Outcome):
                return Outcome(
                    OutcomeStatus.GONE, f"exited during checkpoint: {now.detail}", time.monotonic() - started
                )
            if now.comment.get("checkpoint") != before:
                return Outcome.success(
                    f"checkpoint {now.comment.get('checkpoint')} acknowledged", time.monotonic() - started
                )
            time.sleep(self.poll_seconds)
        return Outcome(
            OutcomeStatus.TIMEOUT, f"no checkpoint within {timeout_seconds}s", time.monotonic() - started
        )

    def terminate_task(self, task_id: str, timeout_seconds: float) -> Outcome:
        """`scancel`: TERM to every step, KILL after KillWait; wait until the run has ended."""
        return self._end(task_id, timeout_seconds, lambda job_id: self.client.cancel(job_id), "scancel")

    def kill_task(self, task_id: str) -> Outcome:
        outcome = self._end(
            task_id,
            self.operation_timeout_seconds,
            lambda job_id: self.client.signal_job(job_id, "KILL", full=True),
            "SIGKILL",
        )
        if outcome.status is OutcomeStatus.TIMEOUT:
            return Outcome(
                OutcomeStatus.FAILED, f"still running after SIGKILL: {outcome.detail}", outcome.seconds
            )
        return outcome

    def _end(self, task_id: str, timeout: float, action: Callable[[str], None], what: str) -> Outcome:
        started = time.monotonic()
        job = self._running(task_id)
        if isinstance(job, Outcome):
            return job
        with self.journal.edit() as journal:
            journal["drained"][task_id] = f"drained ({what})"
        sent = self._act(lambda: action(job.job_id), "", started)
        if not sent.ok:
            return sent
        deadline = started + timeout
        while time.monotonic() < deadline:
            now = self._holding(job.job_id)
            if isinstance(now, Outcome):
                return now
            if now is None:
                return Outcome.success(f"job {job.job_id} ended after {what}", time.monotonic() - started)
            time.sleep(self.poll_seconds)
        return Outcome(
            OutcomeStatus.TIMEOUT,
            f"job {job.job_id} still running {timeout}s after {what}",
            time.monotonic() - started,
        )

    def _holding(self, job_id: str) -> SlurmJob | None | Outcome:
        """The job if it still holds its GPUs (running or completing), else None."""
        try:
            jobs = [j for j in self.slurm_jobs() if j.job_id == job_id and j.holds_gpus]
        except SlurmError as exc:
            return _error_outcome(exc)
        return jobs[0] if jobs else None

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        """No job (with task_id: not that run) holds any of the GPUs, per squeue and the
        node's `gres_used`; polled until `operation_timeout_seconds`."""
        started = time.monotonic()
        wanted = set(gpu_uuids)
        job_id = split_task_id(task_id)[0] if task_id else None
        deadline = started + self.operation_timeout_seconds
        while True:
            try:
                jobs = [
                    j for j in self.slurm_jobs() if j.holds_gpus and (job_id is None or j.job_id == job_id)
                ]
                nodes = {n.name: n for n in self.slurm_nodes()}
            except SlurmError as exc:
                return _error_outcome(exc, time.monotonic() - started)
            unknown = sorted(g for g in wanted if g.rpartition(":")[0] not in nodes)
            if unknown:
                return Outcome(OutcomeStatus.GONE, f"unknown GPU(s): {unknown}", time.monotonic() - started)
            held = {g: j.job_id for j in jobs for g in j.gpu_ids if g in wanted}
            if job_id is None:
                for name, node in nodes.items():
                    for i in node.used_indices:
                        if gpu_id(name, i) in wanted:
                            held.setdefault(gpu_id(name, i), "gres_used")
            if not held:
                return Outcome.success(f"{len(wanted)} GPU(s) free", time.monotonic() - started)
            if time.monotonic() >= deadline:
                return Outcome(OutcomeStatus.TIMEOUT, f"still held: {held}", time.monotonic() - started)
            time.sleep(self.poll_seconds)

    def requeue_task(self, task_id: str) -> Outcome:
        """`scontrol requeue` of a drained checkpointable job: it runs again (elsewhere while its
        node is drained) and resumes from its checkpoint. Refused, with why, for a job that is
        not checkpointable, still runs, or Slurm no longer holds (after MinJobAge)."""
        started = time.monotonic()
        job_id, _ = split_task_id(task_id)
        try:
            jobs = [j for j in self.slurm_jobs() if j.job_id == job_id]
        except SlurmError as exc:
            return _error_outcome(exc)
        if not jobs:
            return Outcome(OutcomeStatus.GONE, f"job {job_id} is no longer known to slurmctld (MinJobAge)")
        job = jobs[0]
        if not job.requeue:
            return Outcome(
                OutcomeStatus.UNSUPPORTED, f"job {job_id} is not requeueable (submitted without --requeue)"
            )
        if job.state in {"PENDING", "RUNNING"} and task_id_of(job) != task_id:
            return Outcome.success(
                f"job {job_id} already {job.state.lower()} again", time.monotonic() - started
            )
        if job.state == "RUNNING":
            return Outcome(OutcomeStatus.FAILED, f"job {job_id} still runs: drain it first")
        if job.state == "COMPLETED":
            return Outcome(OutcomeStatus.UNSUPPORTED, f"job {job_id} completed: nothing to requeue")
        return self._act(lambda: self.client.requeue(job_id), f"job {job_id} requeued", started)

    # -- node operations ------------------------------------------------------------------------
    def _node(self, node_id: str) -> SlurmNode | Outcome:
        try:
            nodes = [n for n in self.slurm_nodes() if n.name == node_id]
        except SlurmError as exc:
            return _error_outcome(exc)
        if not nodes:
            return Outcome(OutcomeStatus.GONE, f"unknown node {node_id}")
        condition = nodes[0].unknown_condition
        if condition is not None:
            return Outcome(OutcomeStatus.REFUSED, f"node {node_id} is in {condition}: not acted on")
        return nodes[0]

    def _update(self, node_id: str, state: str, reason: str, done: str) -> Outcome:
        started = time.monotonic()
        node = self._node(node_id)
        if isinstance(node, Outcome):
            return node
        return self._act(lambda: self.client.update_node(node_id, state, reason), done, started)

    def cordon(self, node_id: str) -> Outcome:
        return self._update(node_id, "drain", CORDON_REASON, f"{node_id} drained (running jobs keep running)")

    def uncordon(self, node_id: str) -> Outcome:
        return self._update(node_id, "resume", "", f"{node_id} resumed")

    def power_off(self, node_id: str) -> Outcome:
        """`power_down_asap`: drain, then SuspendProgram once the node is idle. Done when
        slurmctld has accepted it (the node shows POWER_DOWN or later)."""
        return self._update(node_id, "power_down_asap", POWER_REASON, f"{node_id} powering down")

    def power_on(self, node_id: str) -> Outcome:
        started = time.monotonic()
        try:
            nodes = [n for n in self.slurm_nodes() if n.name == node_id]
        except SlurmError as exc:
            return _error_outcome(exc)
        if not nodes:
            return Outcome(OutcomeStatus.GONE, f"unknown node {node_id}")
        node = nodes[0]
        if not node.powered_off:
            if node.unknown_condition is not None:
                return Outcome(
                    OutcomeStatus.REFUSED, f"node {node_id} is in {node.unknown_condition}: not acted on"
                )
            return Outcome.success(f"{node_id} is on")
        return self._act(
            lambda: self.client.update_node(node_id, "power_up"), f"{node_id} powering up", started
        )


def _slurm_second(moment: datetime) -> datetime:
    """A time to the whole second, as Slurm keeps a begin time."""
    return moment.replace(microsecond=0)


def _begins_at(job: SlurmJob, recorded: str) -> bool:
    """Whether a job's begin time is still the one our deferral gave it (`recorded`, ISO)."""
    if job.eligible_time is None:
        return False
    gap = abs((job.eligible_time - datetime.fromisoformat(recorded)).total_seconds())
    return gap <= BEGIN_SLACK_SECONDS


def _job_number(job_id: str) -> int:
    return int(job_id) if job_id.isdigit() else 0


def _event(ts: datetime, task_id: str, event: str, reason: str, fault: bool = False) -> dict[str, Any]:
    return {"ts": ts, "task_id": task_id, "event": event, "reason": reason, "platform_fault": fault}


def _task_from_record(r: dict[str, Any]) -> TaskInfo:
    return TaskInfo(
        task_id=r["task_id"],
        tenant_id=r["tenant_id"],
        pool_id=r["pool_id"],
        node_id=r["node_id"],
        gpu_uuids=tuple(r["gpu_uuids"]),
        gpu_milli=1000,
        kind=TaskKind(r["kind"]),
        qos=r["qos"],
        priority=r["priority"],
        resource_class=ResourceClass(r["resource_class"]),
        started_at=datetime.fromisoformat(r["started_at"]),
        checkpointable=r["checkpointable"],
    )


def _error_outcome(exc: SlurmError, seconds: float = 0.0) -> Outcome:
    if isinstance(exc, SlurmNotFound):
        return Outcome(OutcomeStatus.GONE, str(exc), seconds)
    if isinstance(exc, SlurmTimeout):
        return Outcome(OutcomeStatus.TIMEOUT, str(exc), seconds)
    if isinstance(exc, SlurmUnavailable):
        return Outcome(OutcomeStatus.FAILED, str(exc), seconds)
    return Outcome(OutcomeStatus.FAILED, str(exc), seconds)
