"""The digital twin of a GPU fleet: nodes, GPUs with free capacity, running tasks, a pending
queue, and simulated time.

Time is integer unix seconds. `advance(until)` processes events (arrivals, task ends, node
joins, GPU XID faults) in (time, kind, key) order and emits telemetry at every sample tick
epoch + k * interval; events at a tick's time are applied before the tick is sampled. Every
random draw comes from a per-hour stream keyed by the seed, and the event order does not
depend on push order, so advancing in one call or in many gives identical output, and the
same seed and the same calls give identical samples. Interventions (see operations.py)
apply at the twin's clock.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import compress, islice, repeat
from typing import Any

import numpy as np
import polars as pl

from market_pipeline.fleet.catalog import FleetCatalog
from market_pipeline.fleet.telemetry import GpuLoad, GpuShare, NoiseBlocks, samples_frame, synthesize_batch
from market_pipeline.fleet.workload import BLOCK_SECONDS, STREAM_XID, Job, WorkloadModel
from market_pipeline.gpus.models import mig_profile_for_slices
from market_pipeline.hardware.protocol import NodeState
from market_pipeline.placement.capacity import MILLI, Placement, PodRequest
from market_pipeline.placement.guarantee import (
    GuaranteedForecast,
    choose_arrival,
    choose_outside,
    closed_nodes,
    held_nodes,
    hold_limit,
    keep_off_draining,
    kept_empty,
    largest_nodes,
    open_outside,
    refilling_nodes,
    reserved_nodes,
)
from market_pipeline.placement.policies import PlacementPolicy
from market_pipeline.placement.queue import backfill


def _may_fit(job: Job, room: tuple[str, int, int, int, int]) -> bool:
    model, cpu, mem, largest, whole = room
    if job.gpu_model != model or job.cpu_milli > cpu or job.mem_mib > mem:
        return False
    if job.num_gpu > 1 or job.gpu_milli >= MILLI:
        return whole >= job.num_gpu
    return largest >= job.gpu_milli


_ARRIVAL_TS = operator.attrgetter("arrival_ts")
_RESOURCE_CLASS = operator.attrgetter("resource_class")
_KIND_ORDER = {"end": 0, "xid": 1, "join": 2, "arrival": 3}
_NEVER = 1 << 62
# A requeued run's id: the drained run's id, this marker and the run number (job-1~r2).
RUN_MARKER = "~r"
# Drained checkpointable work kept for a requeue, newest last: older entries are dropped
# (the drain and its billing are recorded elsewhere; only the chance to requeue is lost).
MAX_REQUEUEABLE = 256


@dataclass(frozen=True)
class TwinParams:
    sample_interval_s: int = 60
    warm_join_s: int = 60  # a WARM node joins the pool this long after power_on
    provision_s: int = 600  # an OFF node is provisioned and joins after this long
    xid_rate_per_gpu_hour: float = 1e-4  # ~10x Llama-3's GPU fault rate, so demos see some
    pending_retry_budget: int = 64  # placement attempts per capacity-freeing event
    pending_scan_limit: int = 512  # queue entries screened per capacity-freeing event
    # the rigid guarantee (`placement.guarantee`): the oldest pending guaranteed tasks each hold
    # the node nearest to fitting them, up to this share of the nodes; drainable tasks keep off
    hold_max_nodes_share: float = 0.0
    # and, while guaranteed tasks are pending, drainable tasks keep off every node of their GPU
    # models (`placement.guarantee.closed_nodes`)
    close_to_drainable: bool = False
    # and, before any guaranteed task waits, drainable tasks keep off the nodes the guaranteed
    # arrivals forecast within `reserve_horizon_s` would take, the forecast being the arrivals
    # per shape over the last `reserve_window_s` (`placement.guarantee.reserved_nodes`; 0: off),
    # re-picked once per sample interval
    reserve_window_s: int = 0
    reserve_horizon_s: int = 0
    # and drainable tasks keep off the last this many empty largest nodes of a GPU model, kept
    # for whole-node guaranteed arrivals (`placement.guarantee.kept_empty`; 0: off)
    empty_nodes_kept: int = 0
    # and, while fewer are empty than that, as many largest nodes running no guaranteed task,
    # nearest to empty, keep drainable tasks off too, so churn refills them
    # (`placement.guarantee.refilling_nodes`)
    refill_empty_nodes: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.sample_interval_s <= BLOCK_SECONDS:
            raise ValueError(f"sample_interval_s must be in 1..{BLOCK_SECONDS}")
        if self.warm_join_s < 0 or self.provision_s < 0 or self.xid_rate_per_gpu_hour < 0:
            raise ValueError("join delays and the XID rate must be >= 0")
        if self.reserve_window_s < 0 or self.reserve_horizon_s < 0 or self.empty_nodes_kept < 0:
            raise ValueError("the guaranteed reserve's window, horizon and empty nodes must be >= 0")


@dataclass
class RunningTask:
    job: Job
    placement: Placement
    positions: list[int]  # catalog GPU positions
    started_ts: int
    end_ts: int  # natural end, or the exit after a SIGTERM
    drain_signal_ts: int | None = None
    sigterm_ts: int | None = None
    checkpoint_ts: int | None = None
    mig_profile: str | None = None  # the MIG instance's profile when it runs on one


class FleetTwin:
    def __init__(
        self,
        catalog: FleetCatalog,
        workload: WorkloadModel,
        policy: PlacementPolicy,
        params: TwinParams,
        seed: int,
        epoch_ts: int,
    ) -> None:
        self.catalog, self.workload, self.policy = catalog, workload, policy
        self.params, self.seed, self.epoch_ts = params, seed, epoch_ts
        self.cap = catalog.to_capacity()
        self.node_state = [n.initial_state for n in catalog.nodes]
        self.cordoned = np.zeros(len(catalog.nodes), dtype=bool)
        self.joining: dict[int, int] = {}  # node row -> ts it joins the pool
        self.clock = epoch_ts
        self.running: dict[str, RunningTask] = {}
        self.pending: list[Job] = []
        self.heap: list[tuple[int, int, str, str, Any]] = []
        self.blocks_generated = 0
        self.next_tick = 0
        self.load = GpuLoad(catalog)
        ticks_per_block = -(-BLOCK_SECONDS // params.sample_interval_s)
        self.noise = NoiseBlocks(seed, catalog.n_gpus, ticks_per_block)
        self.xid_pending = np.zeros(catalog.n_gpus, dtype=np.int32)
        self.stats: Counter[str] = Counter()
        self.new_samples: list[dict[str, np.ndarray]] = []
        self.new_events: list[tuple[int, str, str, str, bool]] = []
        self.new_ended: list[dict[str, Any]] = []
        self._on_positions: np.ndarray | None = None
        # (second, but), held (None: a hold inside the closure, not ranked; see `_off_limits`)
        self._held_at: tuple[tuple[int, str | None], np.ndarray | None] | None = None
        self._off_at: tuple[int, np.ndarray] | None = None  # (second, closed to drainable tasks)
        # tenant -> why its new tasks are refused (a billing budget guard); arrivals of those
        # tenants are turned away at the door and counted, never queued
        self.refused_tenants: dict[str, str] = {}
        # drained task id -> the job that runs the rest of its work if it is requeued
        self.requeueable: dict[str, Job] = {}
        # running task id -> its node row, for tasks under a drain signal: while guaranteed
        # tasks wait, newcomers keep off their nodes (`placement.guarantee.keep_off_draining`)
        self.signalled: dict[str, int] = {}
        # (second, signals version), the draining mask then: `_draining` once per event second
        self._signals = 0
        self._draining_at: tuple[tuple[int, int], np.ndarray | None] | None = None
        # the guaranteed arrivals' forecast and the nodes it reserves (sample interval, mask)
        self.forecast = (
            GuaranteedForecast(params.reserve_window_s)
            if params.reserve_window_s > 0 and params.reserve_horizon_s > 0
            else None
        )
        self._reserved_at: tuple[int, np.ndarray | None] | None = None
        self._largest = largest_nodes(self.cap)  # per GPU model, its nodes with the most GPUs
        self._kept_at: tuple[int, np.ndarray | None] | None = None  # (second, `_kept_empty`)
        # guaranteed tasks running per node (`_refilling`: a node running one is not refilled)
        self.guaranteed_on = np.zeros(self.cap.n_nodes, dtype=np.int64)
        self._refill_at: tuple[int, np.ndarray | None] | None = None  # (second, `_refilling`)

    @classmethod
    def create(
        cls,
        catalog: FleetCatalog,
        workload: WorkloadModel,
        policy: PlacementPolicy,
        params: TwinParams,
        seed: int,
        epoch_ts: int,
    ) -> "FleetTwin":
        """A fresh twin at its epoch with the workload's already-running jobs placed."""
        twin = cls(catalog, workload, policy, params, seed, epoch_ts)
        initial = workload.initial_population(epoch_ts)
        # an operator packs what is already running big jobs first
        for job in sorted(initial, key=lambda j: (-j.num_gpu * j.gpu_milli, j.arrival_ts, j.task_id)):
            placement = twin.policy.choose(twin.cap, job.request())
            if placement is None:  # more already-running work than fits: it never existed here
                twin.stats["initial_unplaced"] += 1
                continue
            twin._start(job, placement, job.arrival_ts)
        return twin

    # -- time ---------------------------------------------------------------------------------
    def tick_ts(self, k: int) -> int:
        return self.epoch_ts + k * self.params.sample_interval_s

    def advance(self, until_ts: int, emit_samples: bool = True) -> None:
        """Run the fleet up to (not including) `until_ts`; the clock ends at `until_ts`."""
        if until_ts <= self.clock:
            return
        self._generate_blocks(until_ts)
        while True:
            next_event = self.heap[0][0] if self.heap else _NEVER
            next_tick = self.tick_ts(self.next_tick)
            if min(next_event, next_tick) >= until_ts:
                break
            if next_event <= next_tick:
                self._process_events_at(next_event)
            else:
                stop = min(next_event, until_ts)
                count = -(-(stop - next_tick) // self.params.sample_interval_s)
                ticks = np.arange(self.next_tick, self.next_tick + count)
                if emit_samples:
                    self.emit_ticks(ticks)
                self.next_tick += count
        self.clock = until_ts

    def _generate_blocks(self, until_ts: int) -> None:
        while self.epoch_ts + self.blocks_generated * BLOCK_SECONDS < until_ts:
            block = self.blocks_generated
            for job in self.workload.block_arrivals(block, self.epoch_ts):
                self.push(job.arrival_ts, "arrival", job.task_id, job)
            self._push_xids(block)
            self.blocks_generated += 1

    def _push_xids(self, block: int) -> None:
        rng = np.random.default_rng([self.seed, STREAM_XID, block])
        expected = self.params.xid_rate_per_gpu_hour * self.catalog.n_gpus * BLOCK_SECONDS / 3600
        count = int(rng.poisson(expected))
        positions = rng.integers(0, max(self.catalog.n_gpus, 1), size=count)
        offsets = rng.integers(0, BLOCK_SECONDS, size=count)
        for i, (pos, off) in enumerate(zip(positions, offsets)):
            ts = self.epoch_ts + block * BLOCK_SECONDS + int(off)
            self.push(ts, "xid", f"{int(pos):08d}-{block}-{i}", int(pos))

    def push(self, ts: int, kind: str, key: str, payload: Any) -> None:
        heapq.heappush(self.heap, (ts, _KIND_ORDER[kind], key, kind, payload))

    def _process_events_at(self, ts: int) -> None:
        self.clock = max(self.clock, ts)
        while self.heap and self.heap[0][0] == ts:
            _, _, _, kind, payload = heapq.heappop(self.heap)
            if kind == "arrival":
                self.stats["arrived"] += 1
                if payload.tenant_id in self.refused_tenants:
                    self.stats["refused"] += 1
                    continue
                if self.forecast is not None and payload.resource_class == "guaranteed":
                    self.forecast.record(ts, payload.request())
                self.pending.append(payload)
                self._try_place(payload, ts, arrival=True)
            elif kind == "end":
                task = self.running.get(payload)
                if task is not None and task.end_ts == ts:  # else stale: the task ended earlier
                    event, reason = self._natural_end(task)
                    self.finish(payload, ts, event, reason)
                    self.schedule_pending(ts, [task.placement.node])
            elif kind == "join":
                if self.joining.get(payload) == ts:
                    del self.joining[payload]
                    self.set_node_state(payload, NodeState.ON)
                    self.schedule_pending(ts, [payload])
            elif kind == "xid":
                self._xid(payload, ts)

    @staticmethod
    def _natural_end(task: RunningTask) -> tuple[str, str]:
        if task.sigterm_ts is not None:
            return "drained", "exited after SIGTERM"
        if task.drain_signal_ts is not None:
            return "drained", "completed after drain signal"
        return "end", "completed"

    def _xid(self, position: int, ts: int) -> None:
        row = int(self.catalog.gpu_node_row[position])
        if self.node_state[row] is not NodeState.ON:
            return
        self.xid_pending[position] += 1
        self.stats["xid"] += 1
        uuid = self.catalog.gpu_uuids[position]
        for task_id in sorted(self.load.holders[position]):
            self.finish(
                task_id, ts, "failed", f"XID 79 (GPU fell off the bus) on {uuid}", platform_fault=True
            )
        self.schedule_pending(ts, [row])

    # -- placement ----------------------------------------------------------------------------
    def _try_place(self, job: Job, ts: int, arrival: bool = False) -> bool:
        """Place a pending job (`placement.guarantee`): a drainable one off the held nodes, a
        newly arrived guaranteed one off them where it fits there, a waiting guaranteed one
        anywhere."""
        if job.resource_class == "drainable":
            draining, off, req = self._draining(), self._off_limits(ts), job.request()
            if draining is not None:
                off = keep_off_draining(off, draining)
            if not open_outside(self.cap, req, off):
                return False  # its GPU model is closed: the search would fail (still one attempt)
            placement = choose_outside(self.policy, self.cap, req, off)
        elif arrival:
            placement = choose_arrival(
                self.policy, self.cap, job.request(), self._held(ts, but=job), self._draining()
            )
        else:
            placement = self.policy.choose(self.cap, job.request())
        if placement is None:
            return False
        if job.resource_class == "drainable" and self._largest[placement.node]:
            row = placement.node  # an empty largest node taken: the kept ones are re-picked
            if (self.cap.gpu_free[row][self.cap.present[row]] >= MILLI).all():
                self._kept_at = self._refill_at = None
        # by identity: `list.remove` compares every job ahead of it field by field
        del self.pending[list(map(id, self.pending)).index(id(job))]
        self._start(job, placement, ts)
        return True

    def signal_drain(self, task: RunningTask) -> None:
        """Mark a running task as under a drain signal at the clock (`operations.warn`)."""
        task.drain_signal_ts = self.clock
        self.signalled[task.job.task_id] = task.placement.node
        self._signals += 1

    def _draining(self) -> np.ndarray | None:
        """(N,) the nodes being emptied by drains while guaranteed tasks wait: the nodes of
        running tasks under a drain signal. None where there is none, or no guaranteed task
        waits (a drain then serves a scale-down, which cordons its node): the placement's hot
        path then builds no mask. Computed once per event second and set of signals, as
        `_held` (finding a pending guaranteed task scans the queue)."""
        if not self.signalled:
            return None
        key = (self.clock, self._signals)
        if self._draining_at is not None and self._draining_at[0] == key:
            return self._draining_at[1]
        draining = None
        if next(self._guaranteed_pending(), None) is not None:
            draining = np.zeros(self.cap.n_nodes, dtype=bool)
            draining[list(self.signalled.values())] = True
        self._draining_at = (key, draining)
        return draining

    def _off_limits(self, ts: int) -> np.ndarray:
        """The nodes a drainable task keeps off: those of `_kept_for_waiting`, the nodes
        reserved for the guaranteed arrivals forecast (`_reserved`), the last empty largest
        nodes of each GPU model (`placement.guarantee.kept_empty`, on the capacity as it is:
        a task placed this second may have taken the one before last) and the nodes refilling
        them (`_refilling`)."""
        off = self._kept_for_waiting(ts)
        reserved = self._reserved(ts)
        off = off if reserved is None else off | reserved
        kept = self._kept_empty(ts)
        off = off if kept is None else off | kept
        refill = self._refilling(ts)
        return off if refill is None else off | refill

    def _kept_empty(self, ts: int) -> np.ndarray | None:
        """The largest nodes kept for whole-node guaranteed arrivals
        (`placement.guarantee.kept_empty`), once per event second, as `_held`: a drainable
        task that takes an empty largest node meanwhile asks again (`_try_place`), so the
        last one is never handed out on a stale answer. None: none is kept."""
        if not self.params.empty_nodes_kept:
            return None
        if self._kept_at is None or self._kept_at[0] != ts:
            kept = kept_empty(self.cap, self.params.empty_nodes_kept, self._largest)
            self._kept_at = (ts, kept if kept.any() else None)
        return self._kept_at[1]

    def _refilling(self, ts: int) -> np.ndarray | None:
        """The largest nodes that refill the empty ones kept for whole-node guaranteed arrivals
        (`placement.guarantee.refilling_nodes`), once per event second, as `_kept_empty`. None:
        none (the rule is off, or every GPU model has its keep of empty nodes)."""
        if not (self.params.refill_empty_nodes and self.params.empty_nodes_kept):
            return None
        if self._refill_at is None or self._refill_at[0] != ts:
            refill = refilling_nodes(
                self.cap, self.params.empty_nodes_kept, self.guaranteed_on > 0, self._largest
            )
            self._refill_at = (ts, refill if refill.any() else None)
        return self._refill_at[1]

    def _reserved(self, ts: int) -> np.ndarray | None:
        """The nodes kept from drainable tasks for the guaranteed arrivals forecast within
        `reserve_horizon_s` (`placement.guarantee.reserved_nodes`), re-picked once per sample
        interval, when a drainable task asks (the simulator re-picks at each control step and
        when rigid work takes reserved room, at most once a minute): guaranteed arrivals in
        between take room from it, which keeps more from drainable work until the next pick.
        None: no reserve."""
        if self.forecast is None:
            return None
        bucket = ts // self.params.sample_interval_s
        if self._reserved_at is None or self._reserved_at[0] != bucket:
            expected = self.forecast.expected(ts, self.params.reserve_horizon_s)
            reserved = reserved_nodes(self.cap, expected) if expected else None
            self._reserved_at = (bucket, reserved if reserved is not None and reserved.any() else None)
        return self._reserved_at[1]

    def _kept_for_waiting(self, ts: int) -> np.ndarray:
        """The nodes a drainable task keeps off for pending guaranteed tasks: the held ones and, with `close_to_drainable`,
        every node of a pending guaranteed task's GPU model (once per event second, as
        `_held`). Where every node the hold could take is closed already (its tasks' models
        were closed this second), the hold adds nothing and is not ranked: the answer is the
        one ranking it gives, and the next miss ranks it again where it could matter."""
        if not self.params.close_to_drainable:
            return self._held(ts)
        if self._off_at is None or self._off_at[0] != ts:
            waiting = {j.request() for j in self._guaranteed_pending()}
            self._off_at = (ts, closed_nodes(self.cap, waiting))
        closed = self._off_at[1]
        key: tuple[int, str | None] = (ts, None)
        if self._held_at is not None and self._held_at[0] == key:
            held = self._held_at[1]
        elif not (closed_nodes(self.cap, self._waiting_guaranteed()) & ~closed).any():
            self._held_at = (key, None)  # a hold inside the closure, not ranked
            return closed
        else:
            held = self._held(ts)
        return closed if held is None else held | closed

    def _waiting_guaranteed(self, but: Job | None = None) -> list[PodRequest]:
        """The requests of the oldest pending guaranteed tasks (but `but`) that may hold a node."""
        limit = hold_limit(self.cap.n_nodes, self.params.hold_max_nodes_share)
        guaranteed = (j for j in self._guaranteed_pending() if j is not but)
        return [j.request() for j in islice(guaranteed, limit)]

    def _guaranteed_pending(self) -> Iterator[Job]:
        """The pending guaranteed tasks, oldest first (the queue filtered without a Python-level
        loop: where the closure keeps thousands of drainable tasks waiting, this runs per event)."""
        classes = map(_RESOURCE_CLASS, self.pending)
        return compress(self.pending, map(operator.eq, classes, repeat("guaranteed")))

    def _held(self, ts: int, but: Job | None = None) -> np.ndarray:
        """The nodes held for the pending guaranteed tasks (but `but`), oldest first
        (`placement.guarantee`), computed once per event second and `but`: a burst of arrivals
        or a freed node's retries in the same second share one answer, as the simulator shares
        one per tick (the capacity they take in that second only shrinks what the held nodes
        could give sooner)."""
        key = (ts, None if but is None else but.task_id)
        if self._held_at is not None and self._held_at[0] == key and self._held_at[1] is not None:
            return self._held_at[1]
        limit = hold_limit(self.cap.n_nodes, self.params.hold_max_nodes_share)
        waiting = self._waiting_guaranteed(but)
        held = held_nodes(self.cap, waiting, limit) if waiting else np.zeros(self.cap.n_nodes, dtype=bool)
        self._held_at = (key, held)
        return held

    def schedule_pending(self, ts: int, rows: Sequence[int] = ()) -> None:
        """Capacity was freed on node `rows`: abandon jobs that waited too long, then place
        what fits, first in, first out with backfill (`placement.queue.backfill`, the
        simulator's rule too). Every pending job failed at its
        last try and capacity elsewhere only shrank since, so only jobs that could fit on the
        freed nodes are tried: a cheap screen, then at most `pending_retry_budget` calls (a
        drainable job of a closed GPU model counts as one, refused without a search:
        `placement.guarantee.open_outside`)."""
        timeout = self.workload.params.pending_timeout_s
        if self.pending and ts - min(map(_ARRIVAL_TS, self.pending)) > timeout:
            waiting = [j for j in self.pending if ts - j.arrival_ts <= timeout]
            self.stats["abandoned"] += len(self.pending) - len(waiting)
            self.pending[:] = waiting
        rows = [r for r in rows if self.cap.schedulable[r]]
        if not self.pending or not rows:
            return
        room = {r: self._room(r) for r in rows}

        def may_fit(job: Job) -> bool:
            return any(_may_fit(job, r) for r in room.values())

        def place(job: Job) -> bool:
            if not self._try_place(job, ts):
                return False
            room.update({r: self._room(r) for r in rows})
            return True

        backfill(
            self.pending[: self.params.pending_scan_limit], may_fit, place, self.params.pending_retry_budget
        )

    def _room(self, row: int) -> tuple[str, int, int, int, int]:
        """(model, free CPU, free memory, largest free GPU milli, whole free GPUs) of a node."""
        free = self.cap.gpu_free[row][self.cap.present[row]]
        return (
            self.catalog.nodes[row].gpu_model,
            int(self.cap.cpu_free[row]),
            int(self.cap.mem_free[row]),
            int(free.max()) if len(free) else 0,
            int((free >= MILLI).sum()),
        )

    def _start(self, job: Job, placement: Placement, ts: int) -> None:
        node = self.catalog.nodes[placement.node]
        base = int(self.catalog.gpu_offsets[placement.node])
        spec = self.catalog.models[node.gpu_model]
        mig = mig_profile_for_slices(spec, placement.mig_slices) if placement.mig_instance else None
        task = RunningTask(
            job, placement, [base + s for s in placement.gpus], ts, ts + job.lifetime_s, mig_profile=mig
        )
        self.attach(task)
        self.push(task.end_ts, "end", job.task_id, job.task_id)
        self.new_events.append(
            (ts, job.task_id, "start", f"placed on {node.node_id} by {self.policy.name}", False)
        )
        self.stats["started"] += 1

    def attach(self, task: RunningTask) -> None:
        """Reserve a running task's capacity and account its load (start, or state reload)."""
        job = task.job
        self.cap.allocate(job.request(), task.placement)
        self.running[job.task_id] = task
        if job.resource_class == "guaranteed":
            self.guaranteed_on[task.placement.node] += 1
        if task.drain_signal_ts is not None:  # a state reload of a task under a drain signal
            self.signalled[job.task_id] = task.placement.node
            self._signals += 1
        share = GpuShare(
            job.task_id,
            job.tenant_id,
            task.placement.milli / MILLI,
            job.util_level,
            job.kind == "inference",
            job.gpu_mem_share * self.reserved_mem_mib(task),
            task.mig_profile,
        )
        self.load.add(task.positions, share)

    def reserved_mem_mib(self, task: RunningTask) -> float:
        """GPU memory a task holds on each of its GPUs."""
        spec = self.catalog.models[task.job.gpu_model]
        if task.mig_profile:
            gb = task.mig_profile.split(".")[-1].removesuffix("gb")
            if gb.isdigit():
                return float(int(gb) * 1024)
        return spec.memory_mib * task.placement.milli / MILLI

    def finish(self, task_id: str, ts: int, event: str, reason: str, platform_fault: bool = False) -> None:
        task = self.running.pop(task_id)
        if task.job.resource_class == "guaranteed":
            self.guaranteed_on[task.placement.node] -= 1
        if self.signalled.pop(task_id, None) is not None:
            self._signals += 1
        self.cap.release(task.job.request(), task.placement)
        self.load.remove(task.positions, task_id)
        self.new_events.append((ts, task_id, event, reason, platform_fault))
        self.new_ended.append(
            {
                "task_id": task_id,
                "ended_ts": ts,
                "end_reason": reason,
                "event": event,
                **self.task_record(task),
            }
        )
        self.stats[event] += 1
        if event == "drained" and task.job.checkpointable:
            self._keep_requeueable(task, ts)

    def _keep_requeueable(self, task: RunningTask, ts: int) -> None:
        """The rest of a drained checkpointable task's work, from its last checkpoint (from
        the start when it saved none), as the job a requeue submits."""
        job = task.job
        base, _, run = job.task_id.partition(RUN_MARKER)
        done = (task.checkpoint_ts or task.started_ts) - task.started_ts
        self.requeueable[job.task_id] = replace(
            job,
            task_id=f"{base}{RUN_MARKER}{int(run) + 1 if run.isdigit() else 2}",
            lifetime_s=max(1, job.lifetime_s - done),
            arrival_ts=ts,
        )
        while len(self.requeueable) > MAX_REQUEUEABLE:
            del self.requeueable[next(iter(self.requeueable))]

    def requeue(self, task_id: str) -> Job:
        """Submit the rest of a drained task's work as a new run (queued, placed when it fits);
        KeyError when there is none to requeue."""
        job = replace(self.requeueable.pop(task_id), arrival_ts=self.clock)
        self.pending.append(job)
        self._try_place(job, self.clock)
        return job

    def task_record(self, task: RunningTask) -> dict[str, Any]:
        """The attributes TaskInfo is built from (also stored for ended tasks)."""
        job, node = task.job, self.catalog.nodes[task.placement.node]
        return {
            "tenant_id": job.tenant_id,
            "pool_id": node.pool_id,
            "node_id": node.node_id,
            "gpu_uuids": [self.catalog.gpu_uuids[g] for g in task.positions],
            "gpu_milli": task.placement.milli,
            "kind": job.kind,
            "qos": job.qos,
            "priority": job.priority,
            "resource_class": job.resource_class,
            "started_ts": task.started_ts,
            "mem_mib": int(self.reserved_mem_mib(task)),
            "mig_profile": task.mig_profile,
            "do_not_drain": job.do_not_drain,
            "checkpointable": job.checkpointable,
        }

    # -- nodes ----------------------------------------------------------------------------------
    def set_node_state(self, row: int, state: NodeState) -> None:
        self.node_state[row] = state
        self.cap.schedulable[row] = state is NodeState.ON and not self.cordoned[row]
        self._on_positions = None

    def set_cordoned(self, row: int, cordoned: bool) -> None:
        self.cordoned[row] = cordoned
        self.cap.schedulable[row] = self.node_state[row] is NodeState.ON and not cordoned

    def schedule_join(self, row: int, ts: int) -> None:
        self.joining[row] = ts
        self.push(ts, "join", f"{row:08d}", row)

    # -- telemetry ------------------------------------------------------------------------------
    def on_positions(self) -> np.ndarray:
        if self._on_positions is None:
            on_rows = np.array([s is NodeState.ON for s in self.node_state], dtype=bool)
            self._on_positions = np.flatnonzero(on_rows[self.catalog.gpu_node_row])
        return self._on_positions

    def emit_ticks(self, ticks: np.ndarray) -> None:
        tick_ts = self.epoch_ts + ticks * self.params.sample_interval_s
        factor = np.clip(self.workload.profile.factor(tick_ts - self.epoch_ts), 0.3, 1.7)
        positions = self.on_positions()
        if len(positions) == 0:
            return
        self.new_samples.append(
            synthesize_batch(self.load, tick_ts, positions, self.noise.take(ticks), factor, self.xid_pending)
        )
        self.xid_pending[:] = 0

    def take_outputs(
        self,
    ) -> tuple[pl.DataFrame | None, list[tuple[int, str, str, str, bool]], list[dict[str, Any]]]:
        """Samples, task events and ended-task records produced since the last call."""
        samples = samples_frame(self.load, self.new_samples) if self.new_samples else None
        events, ended = self.new_events, self.new_ended
        self.new_samples, self.new_events, self.new_ended = [], [], []
        return samples, events, ended
