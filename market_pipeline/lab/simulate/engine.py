"""The discrete-event loop of one strategy run.

Events: arrivals (generated per tick, sorted), job finishes and drain completions (a heap).
The run opens from the steady state of the strategy's own opening prices (`opening`) and
runs the warm-up days unmeasured (`Meter.restart`). At each tick start the strategy posts
prices from a `MarketView`; the tenants' demand at those prices sets the tick's arrivals,
and deferred elastic work whose price is met now is submitted (`deferral`: turned-away
elastic work waits for a price it accepts). A job is placed at once by the pool's placement
policy or waits in its pool's queue (rigid jobs first, then elastic; within a class by
request shape, oldest first); whenever capacity frees up the queue is retried. While rigid
jobs wait in a pool, the oldest hold the nodes nearest to fitting them and elastic jobs, new
or drained, are not placed in that pool at all (`placement.guarantee`, the rigid guarantee:
the held nodes and `closed_nodes`); before any waits, the nodes the pool's forecast rigid
arrivals would take are kept from elastic work (`reserved_nodes`). A rigid job
that does not fit spills to another pool or waits for drains (`_spill`, `_drain_for`), both tried
every control-loop tick (drains only there, as the live drain planner runs). Billing integrates each class's running GPUs times the posted
price; a drained job stops paying at its drain signal.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

import numpy as np

from market_pipeline.lab.simulate.arrivals import InitialJobs, buy_ratio, candidates, split
from market_pipeline.lab.simulate.cluster import PoolCluster
from market_pipeline.lab.simulate.deferral import DeferredDemand
from market_pipeline.lab.simulate.drains import DrainController
from market_pipeline.lab.simulate.inputs import expected_sm_share
from market_pipeline.lab.simulate.jobs import DONE, DRAINING, QUEUED, RUNNING, Jobs
from market_pipeline.lab.simulate.metrics import Meter, StrategyResult, summarize
from market_pipeline.lab.simulate.opening import opening_jobs, opening_prices
from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID, MarketView, PricingStrategy, StaticPricing
from market_pipeline.lab.simulate.run_inputs import RunInputs
from market_pipeline.lab.simulate.tenants import best_response
from market_pipeline.placement.capacity import Placement, PodRequest
from market_pipeline.placement.guarantee import (
    GuaranteedForecast,
    closed_nodes,
    drain_after_seconds,
    drain_due,
    drain_order,
    held_nodes,
    hold_limit,
    reserved_nodes,
)
from market_pipeline.placement.queue import backfill

# a rigid job that takes reserved room re-picks its pool's reserve at most this often (seconds);
# re-picking on every take cost 3x the run's time on gpushare100/vcLJZ (28,804 picks a day)
REPICK_S = 60.0

FINISH, DRAIN_DONE = 0, 1  # the heap's event kinds


class StrategyRun:
    def __init__(self, inputs: RunInputs, strategy: PricingStrategy) -> None:
        self.inputs = inputs
        self.strategy = strategy
        s = inputs.settings
        self.tick_s = s.tick_seconds
        guarantee = inputs.config.guardrails.rigid_guarantee
        self.clusters = [
            PoolCluster(
                p,
                inputs.nodes,
                s.placement_policy,
                inputs.typical,
                list(inputs.requests),
                guarantee.empty_nodes_kept if guarantee.enabled else 0,
                guarantee.enabled and guarantee.refill_empty_nodes,
            )
            for p in inputs.pools
        ]
        self.capacity = np.array([c.capacity_gpus for c in self.clusters])
        self.unit_cost = np.array([p.prices.unit_cost for p in inputs.pools])
        self.serve_cost = np.array([p.prices.serve_cost for p in inputs.pools])
        self.jobs = Jobs()
        self.warmup = s.warmup_ticks
        self.meter = Meter(len(inputs.pools), self.warmup + s.ticks)
        self.queues: list[tuple[dict, dict]] = [({}, {}) for _ in inputs.pools]
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.node_jobs: list[dict[int, set[int]]] = [{} for _ in inputs.pools]
        self.drainer = (
            DrainController(inputs.config, inputs.epoch, inputs.model.ids, inputs.pods.qos, s.tick_minutes)
            if strategy.drains
            else None
        )
        self.awaited: dict[int, set[int]] = {}  # rigid job -> victims still draining for it
        self.victim_of: dict[int, int] = {}
        self.parked: dict[int, list[int]] = {}  # rigid job -> its drained victims not yet re-placed
        self.drain_room: dict[int, tuple[int, int]] = {}  # rigid job -> (pool, node) its drains empty
        self.history = list(inputs.index_history)
        self.pod_gpus = inputs.pods.gpus.tolist()
        self.pod_runtime = inputs.pods.runtime_s.tolist()
        # each pod's allowed GPU models as a small int, and one request per such set: what
        # closing a pool to drainable work reads of its waiting rigid jobs (`_refresh_holds`)
        model_sets = {models: i for i, models in enumerate(dict.fromkeys(r.models for r in inputs.requests))}
        self.pod_model_set = [model_sets[r.models] for r in inputs.requests]
        self.model_set_request = {model_sets[r.models]: r for r in inputs.requests}
        self.pod_use = (inputs.pods.gpus * expected_sm_share(inputs.pods)).tolist()  # used GPUs per job
        self.deferred = DeferredDemand(inputs.model.elastic, 3600.0 * s.economics.elastic_patience_hours)
        self.latent = inputs.model.latent_mask.tolist()
        self.tick = 0
        self._no_room: dict[tuple[int, int, int], int] = {}  # (pool, shape) -> control step a plan failed
        self.opening_jobs = 0
        # the live control loop's cadence: waiting rigid jobs retry spill and drains this often
        self.control_s = 60.0 * min(inputs.config.loop.tick_minutes, s.tick_minutes)
        self.control_step = 0
        # a waiting rigid job's drains are planned at the latest control step still in time, or
        # at once where it needs a whole node (`placement.guarantee.drain_due`)
        self.drain_after_s = (
            drain_after_seconds(inputs.sla_wait_s, self.drainer.seconds, self.control_s)
            if self.drainer is not None and guarantee.enabled and guarantee.drain_at_latest_step
            else 0.0
        )
        # a due job is still in time while drains planned now end within its SLA wait; which
        # jobs are drained for, in what order (`placement.guarantee.drain_order`)
        self.drain_in_time_s = inputs.sla_wait_s - (self.drainer.seconds if self.drainer is not None else 0.0)
        self.late_drains = guarantee.late_drains if guarantee.enabled else "oldest_first"
        self.largest_gpus = [int(c.node_gpus.max(initial=0)) for c in self.clusters]
        self.spilled = 0  # rigid jobs placed on another pool than the one they were drawn for
        self.epoch_s = inputs.epoch.timestamp()
        self.bought = np.zeros(2 * len(inputs.pools))  # GPUs requested this tick per resource
        self.bought_last: np.ndarray | None = None
        self.hold_limits = [
            hold_limit(c.node_count(), guarantee.hold_max_nodes_share if guarantee.enabled else 0.0)
            for c in self.clusters
        ]
        self.hold_stale = [True] * len(self.clusters)  # the pool's waiting rigid work changed
        self.close_to_elastic = guarantee.enabled and guarantee.close_to_drainable
        # per pool, its rigid arrivals' forecast: the room it expects within one SLA wait is
        # kept from elastic work (`placement.guarantee.reserved_nodes`), re-picked every control step
        window_s = 60.0 * guarantee.forecast_window_minutes if guarantee.enabled else 0.0
        self.forecasts = [GuaranteedForecast(window_s) for _ in self.clusters] if window_s > 0 else None
        self.expected: list[list[PodRequest]] = [[] for _ in self.clusters]  # at the last control step
        self.reserve_stale = [False] * len(self.clusters)  # a rigid job took reserved room since
        self.reserve_picked = [-np.inf] * len(self.clusters)  # when each pool's reserve was picked
        self.now = 0.0  # the time of the last control step or job start

    # -- event loop ---------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None) -> StrategyResult:
        started = time.perf_counter()
        inputs, s = self.inputs, self.inputs.settings
        prices = self._initial_prices()
        prices = self._place_initial(prices)
        for tick in range(self.warmup + s.ticks):
            if tick == self.warmup and tick:
                self.meter.restart()  # the warm-up is over: measure from here
            self.tick = tick
            t0 = tick * self.tick_s
            self._until(t0)
            self.meter.pending_by_class[tick] = self.meter.waiting().sum(axis=0)
            decision = self.strategy.decide(self._view(tick, t0, prices))
            prices = decision.prices
            self._control(t0, prune=True)
            hour = int(((self.epoch_s + t0) % 86_400) // 3600)  # the true response's hour of day
            wanted = best_response(inputs.model, prices, hour)
            floor = inputs.floor_demand
            k = float(inputs.load_index[tick])
            ratio = buy_ratio(wanted, floor)  # the load index k cancels out
            late = self.deferred.release(ratio, t0)
            for i in range(late.size):  # deferred elastic work that buys at this tick's price
                self._arrive(int(late.tenant[i]), int(late.pool[i]), int(late.pod[i]), t0)
            cands = candidates(inputs.model, floor * k, t0, self.tick_s, s.seed, tick)
            kept, turned_away, overflow = split(cands, ratio)
            self.deferred.add(turned_away)
            self.meter.thinning_overflow += overflow
            marks = iter(t0 + np.arange(self.control_s, self.tick_s - 1e-9, self.control_s))
            mark = next(marks, None)
            for i in range(kept.size):
                t = float(kept.time[i])
                while mark is not None and mark <= t:
                    self._control(float(mark))
                    mark = next(marks, None)
                self._until(t)
                self._arrive(int(kept.tenant[i]), int(kept.pool[i]), int(kept.pod[i]), t)
            while mark is not None:
                self._control(float(mark))
                mark = next(marks, None)
            self._until(t0 + self.tick_s)
            self._record_rigid(tick, t0 + self.tick_s)
            self.meter.close_tick(
                tick, t0 + self.tick_s, self.tick_s, prices, self.capacity, self.unit_cost, self.serve_cost
            )
            self.meter.arrivals[tick] = kept.size + late.size
            self.bought_last, self.bought = self.bought, np.zeros_like(self.bought)
            self.history.append(kept.size / max(self._expected_arrivals(wanted), 1e-9))
            if progress is not None:
                progress(tick)
        return self._result(time.perf_counter() - started)

    def _control(self, t: float, prune: bool = False) -> None:
        """A control-loop tick (every `loop.tick_minutes`, as the live pipeline's drain
        planner runs; prices change only every pricing tick): waiting rigid jobs try the
        other pools, then the drain guardrail."""
        self._until(t)
        self.now = t
        self.control_step += 1
        self.hold_stale = [True] * len(self.clusters)  # capacity moved since: re-pick the held nodes
        if self.forecasts is not None:
            for r, forecast in enumerate(self.forecasts):
                self.expected[r] = forecast.expected(t, self.inputs.sla_wait_s)
                self.reserve_stale[r] = True
        self._retry_spill(t)
        if self.drainer is not None:
            self._retry_drains(t)
            if prune:
                self.drainer.prune(t)

    def _record_rigid(self, tick: int, t: float) -> None:
        """The guarantee's per-tick record: rigid jobs waiting now, those of them waiting past
        their SLA wait, and rigid jobs past it so far (late starts measured since the warm-up,
        plus those waiting past it)."""
        jobs, sla = self.jobs, self.inputs.sla_wait_s
        waiting = late = 0
        for rigid, _ in self.queues:
            for queue in rigid.values():
                waiting += len(queue)
                late += sum(1 for j in queue if t - jobs.arrival[j] > sla)
        self.meter.rigid_waiting[tick] = waiting
        self.meter.rigid_waiting_late[tick] = late
        self.meter.rigid_past_sla[tick] = self.meter.rigid_sla_violations + late

    def _initial_prices(self) -> np.ndarray:
        return np.repeat([p.prices.list_price for p in self.inputs.pools], 2).astype(np.float64)

    def _expected_arrivals(self, wanted: np.ndarray) -> float:
        gh = self.inputs.model.mean_gpu_hours
        rates = np.where(gh > 0, wanted / np.where(gh > 0, gh, 1.0), 0.0)
        return float(rates.sum()) * self.tick_s / 3600.0

    def _view(self, tick: int, t0: float, prices: np.ndarray) -> MarketView:
        return MarketView(
            tick,
            t0,
            self.capacity,
            self.meter.allocated(),
            self.meter.waiting(),
            np.asarray(self.history, dtype=np.float64),
            prices.copy(),
            None if self.bought_last is None else self.bought_last.copy(),
        )

    def _push(self, t: float, kind: int, job: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, job, self.jobs.epoch[job]))

    def _until(self, t: float) -> None:
        heap, jobs = self.heap, self.jobs
        while heap and heap[0][0] <= t:
            when, _, kind, job, epoch = heapq.heappop(heap)
            if epoch != jobs.epoch[job]:
                continue
            if kind == FINISH:
                self._finish(job, when)
            else:
                self._drain_done(job, when)

    # -- jobs -----------------------------------------------------------------------------------
    def _place_initial(self, list_prices: np.ndarray) -> np.ndarray:
        """Place the snapshot of running jobs at the strategy's opening prices (`opening`; with
        `settings.opening` "list", the list-price snapshot for every strategy); return those
        prices (the first tick's last prices)."""
        inputs = self.inputs
        history = np.asarray(self.history, dtype=np.float64)
        prices = list_prices.copy()
        if inputs.settings.opening == "own" and not isinstance(self.strategy, StaticPricing):
            # the list-price snapshot as static pricing's run places it: what runs, what waits
            steady = StrategyRun(inputs, StaticPricing(inputs.pools))
            steady._place_jobs(inputs.initial)
            held, waiting = steady.meter.allocated(), steady.meter.waiting()
            prices = opening_prices(self.strategy, self.capacity, held, history, list_prices, waiting)
        init = opening_jobs(
            inputs.model,
            inputs.pods,
            prices,
            inputs.initial_index,
            inputs.settings.seed,
            inputs.initial,
            list_prices,
        )
        self._place_jobs(init)
        return prices

    def _place_jobs(self, init: InitialJobs) -> None:
        """Place a snapshot of running jobs (each with its runtime left) at time 0."""
        self.opening_jobs = int(init.tenant.size)
        for j, r, pod, left in zip(
            init.tenant.tolist(), init.pool.tolist(), init.pod.tolist(), init.remaining_s.tolist()
        ):
            cls = ELASTIC if self.inputs.model.elastic[j] else RIGID
            job = self.jobs.add(j, r, pod, cls, self.pod_gpus[pod], 0.0, left)
            self._place_or_queue(job, 0.0)

    def _arrive(self, tenant: int, pool: int, pod: int, t: float) -> None:
        cls = ELASTIC if self.inputs.model.elastic[tenant] else RIGID
        job = self.jobs.add(tenant, pool, pod, cls, self.pod_gpus[pod], t, self.pod_runtime[pod])
        self.bought[2 * pool + cls] += self.pod_gpus[pod]
        if cls == RIGID and self.forecasts is not None:
            self.forecasts[pool].record(t, self.inputs.requests[pod])
        self._place_or_queue(job, t)

    def _place_or_queue(self, job: int, t: float) -> None:
        """A job not waiting yet (an arrival, a drained job). A rigid one takes, in order: room
        in its pool off the nodes held for the pool's waiting rigid jobs, room in the pools it
        may spill to (off theirs), then a held node of its pool (`placement.guarantee`: new
        guaranteed work that can run elsewhere leaves the held room to the waiting jobs, which
        often cannot); else it waits. An elastic one: its pool off the held nodes, else waits."""
        jobs = self.jobs
        r, req = jobs.pool[job], self.inputs.requests[jobs.pod[job]]
        if jobs.cls[job] == RIGID:
            self._refresh_holds(r)
            placement = self.clusters[r].place(req, off_held=True)
            if placement is None and self._spill(job, t):
                return
            if placement is None and self.clusters[r].held.any():
                placement = self.clusters[r].place(req, newcomer=True)
        else:
            placement = self._place(r, req, True)
        if placement is not None:
            self._start(job, placement, t)
            return
        self._enqueue(job)  # a rigid one's drains are planned at the next control step (`_control`)

    def _place(self, r: int, req: PodRequest, elastic: bool) -> Placement | None:
        """Pool r's placement policy; an elastic job keeps off the nodes held for the pool's
        waiting rigid jobs (`placement.guarantee`, re-picked when that work changed)."""
        if elastic:
            self._refresh_holds(r)
        return self.clusters[r].place(req, elastic)

    def _refresh_holds(self, r: int) -> None:
        """Re-pick pool r's held nodes if its waiting rigid work changed since, and its
        reserved ones (for the rigid arrivals forecast at the last control step) if a control
        step passed, or a rigid job took reserved room a minute or more after the last pick
        (`REPICK_S`, the twin's sample interval: at most once a minute between control steps)."""
        cluster = self.clusters[r]
        if self.reserve_stale[r]:
            self.reserve_stale[r] = False
            if self.expected[r] or cluster.reserved.any():
                cluster.reserved = reserved_nodes(cluster.cap, self.expected[r])
                self.reserve_picked[r] = self.now
        if not self.hold_stale[r]:
            return
        self.hold_stale[r] = False
        waiting = self._oldest_rigid(r, self.hold_limits[r])
        if waiting:
            cluster.held = held_nodes(cluster.cap, waiting, self.hold_limits[r])
        elif cluster.held.any():
            cluster.held[:] = False
        if self.close_to_elastic and self.queues[r][RIGID]:
            sets, pods = self.pod_model_set, self.jobs.pod
            waiting = {sets[pods[j]] for q in self.queues[r][RIGID].values() for j in q}
            cluster.closed = closed_nodes(cluster.cap, [self.model_set_request[i] for i in waiting])
        elif cluster.closed.any():
            cluster.closed[:] = False

    def _oldest_rigid(self, r: int, limit: int) -> list[PodRequest]:
        """The requests of pool r's `limit` oldest waiting rigid jobs, oldest first."""
        if limit <= 0 or not self.queues[r][RIGID]:
            return []
        jobs = self.jobs
        heads = [j for q in self.queues[r][RIGID].values() for j in islice(q, limit)]
        heads.sort(key=lambda j: jobs.arrival[j])
        return [self.inputs.requests[jobs.pod[j]] for j in heads[:limit]]

    def _enqueue(self, job: int) -> None:
        jobs = self.jobs
        req = self.inputs.requests[jobs.pod[job]]
        groups = self.queues[jobs.pool[job]][jobs.cls[job]]
        groups.setdefault((req.num_gpu, req.gpu_milli), deque()).append(job)
        jobs.state[job] = QUEUED
        if jobs.cls[job] == RIGID:
            self.hold_stale[jobs.pool[job]] = True
        self.meter.pending(jobs.pool[job], jobs.cls[job], jobs.gpus[job])

    def _dequeue(self, job: int) -> None:
        """Take a waiting job out of its pool's queue (the inverse of `_enqueue`)."""
        jobs = self.jobs
        req = self.inputs.requests[jobs.pod[job]]
        groups = self.queues[jobs.pool[job]][jobs.cls[job]]
        key = (req.num_gpu, req.gpu_milli)
        groups[key].remove(job)
        if not groups[key]:
            del groups[key]
        if jobs.cls[job] == RIGID:
            self.hold_stale[jobs.pool[job]] = True
        self.meter.pending(jobs.pool[job], jobs.cls[job], -jobs.gpus[job])

    def _start(self, job: int, placement: Placement, t: float) -> None:
        jobs, meter = self.jobs, self.meter
        r, cls, gpus = jobs.pool[job], jobs.cls[job], jobs.gpus[job]
        if cls == RIGID and jobs.state[job] == QUEUED:
            self.hold_stale[r] = True  # it may have been waiting (its queue entry is gone)
            self._release_drain_room(job)  # it started before its drains were done
        self.now = t
        if (
            cls == RIGID
            and self.clusters[r].reserved[placement.node]
            and t - self.reserve_picked[r] >= REPICK_S
        ):
            self.reserve_stale[r] = True  # it took reserved room: the reserve is re-picked whole
        jobs.placement[job] = placement
        jobs.state[job] = RUNNING
        jobs.run_start[job] = t
        jobs.epoch[job] += 1
        if jobs.first_start[job] != jobs.first_start[job]:  # NaN: first start
            jobs.first_start[job] = t
            wait = t - jobs.arrival[job]
            meter.record_wait(wait, cls)
            if cls == RIGID and wait > self.inputs.sla_wait_s:
                meter.sla_violation(self.inputs.requests[jobs.pod[job]].num_gpu, self.inputs.pools[r].pool_id)
        self._push(t + jobs.remaining[job], FINISH, job)
        meter.change(
            r,
            t,
            cls,
            alloc=gpus,
            bill=gpus,
            used=self.pod_use[jobs.pod[job]],
            latent=self.latent[jobs.tenant[job]],
            bill_pool=jobs.bill_pool[job],
        )
        if cls == ELASTIC and self.drainer is not None:
            self.node_jobs[r].setdefault(placement.node, set()).add(job)
        elif cls == RIGID:
            self.clusters[r].rigid_jobs[placement.node] += 1

    def _stop(self, job: int) -> None:
        """Take a running job off its GPUs' books (not off the capacity)."""
        jobs = self.jobs
        placement = jobs.placement[job]
        if jobs.cls[job] == RIGID and placement is not None:
            self.clusters[jobs.pool[job]].rigid_jobs[placement.node] -= 1
        if jobs.cls[job] == ELASTIC and self.drainer is not None and placement is not None:
            members = self.node_jobs[jobs.pool[job]].get(placement.node)
            if members is not None:
                members.discard(job)
                if not members:
                    del self.node_jobs[jobs.pool[job]][placement.node]

    def _finish(self, job: int, t: float) -> None:
        jobs = self.jobs
        r, cls, gpus = jobs.pool[job], jobs.cls[job], jobs.gpus[job]
        placement = jobs.placement[job]
        assert placement is not None
        self._stop(job)
        self.clusters[r].release(self.inputs.requests[jobs.pod[job]], placement)
        jobs.placement[job] = None
        jobs.state[job] = DONE
        self.meter.change(
            r,
            t,
            cls,
            alloc=-gpus,
            bill=-gpus,
            used=-self.pod_use[jobs.pod[job]],
            latent=self.latent[jobs.tenant[job]],
            bill_pool=jobs.bill_pool[job],
        )
        self._scan(r, placement.node, t)

    def _scan(self, r: int, row: int, t: float) -> None:
        """Capacity freed on node `row`: the waiting jobs were placed nowhere before and only
        this node gained room, so a job is offered to the policy only if it fits here. Rigid
        jobs first, oldest first, with backfill (`_backfill`); then elastic jobs, request
        shapes oldest head first, FIFO per shape."""
        cluster, jobs, meter, requests = self.clusters[r], self.jobs, self.meter, self.inputs.requests
        for cls in (RIGID, ELASTIC):
            groups = self.queues[r][cls]
            if not groups:
                continue
            if cls == RIGID:
                self._backfill(r, row, t)
                continue
            for key in sorted(groups, key=lambda k: jobs.arrival[groups[k][0]]):
                queue = groups[key]
                while queue:
                    job = queue[0]
                    req = requests[jobs.pod[job]]
                    if not cluster.fits_node(req, row):
                        break
                    placement = self._place(r, req, cls == ELASTIC)
                    if placement is None:
                        break
                    queue.popleft()
                    meter.pending(r, cls, -jobs.gpus[job])
                    self._start(job, placement, t)
                if not queue:
                    del groups[key]

    def _backfill(self, r: int, row: int, t: float) -> None:
        """Pool r's waiting rigid jobs, oldest first: each that fits node `row` is placed, past
        any that does not (`placement.queue.backfill`, the rule the fleet's twin places its pending jobs by).
        Jobs of one GPU shape differ in CPU and memory, so a job that needs more cores than
        the freed node has must not keep the others waiting while the room would take them
        (a new arrival is placed on that room at once). On gpuspec33/vc3sl/s17 (#46) a
        24-core job at the head of the 1-GPU queue kept 1-GPU jobs of 11-12 cores waiting in
        `V100M32` while nine of its nodes had a free GPU and 12-20 free cores."""
        cluster, jobs, meter, requests = self.clusters[r], self.jobs, self.meter, self.inputs.requests
        groups = self.queues[r][RIGID]

        def may_fit(entry: tuple[float, int, object]) -> bool:
            return cluster.fits_node(requests[jobs.pod[entry[1]]], row)

        def place(entry: tuple[float, int, object]) -> bool:
            _, job, key = entry
            placement = self._place(r, requests[jobs.pod[job]], False)
            if placement is None:
                return False
            groups[key].remove(job)
            if not groups[key]:
                del groups[key]
            meter.pending(r, RIGID, -jobs.gpus[job])
            self._start(job, placement, t)
            return True

        backfill(sorted((jobs.arrival[j], j, key) for key, q in groups.items() for j in q), may_fit, place)

    # -- rigid jobs that cannot be placed at once: spill, then drains ---------------------------
    # A rigid job whose pool is full tries the other pools its pod fits (`RunInputs.spill`:
    # nearest list price first; the trace names no GPU model), off the nodes they hold for their
    # own waiting rigid jobs; failing that, the task-drain guardrail looks for drainable jobs to
    # drain, in its pool and then in those other pools. Both are tried at every control-loop
    # tick while it waits (drains only there: the live drain planner runs at those ticks, not
    # when a task arrives). The room a drain makes is held for the rigid job until every victim
    # is out: newcomers keep off the node meanwhile (`placement.guarantee.keep_off_draining`),
    # and drained jobs are re-placed only after it (best-fit would otherwise put a victim
    # straight back on the node it was drained from).
    def _spill(self, job: int, t: float) -> bool:
        """Place a rigid job whose own pool is full on another pool its pod fits (nearest list
        price first). It runs (and counts towards utilisation) there and pays the price of the
        pool it bought in: the platform substituted the hardware, the tenant's offer stands.
        Elastic work waits in its pool instead: it is delay tolerant."""
        jobs = self.jobs
        if not self.inputs.spill:
            return False
        req = self.inputs.requests[jobs.pod[job]]
        for r in self.inputs.spill[jobs.pool[job]][jobs.pod[job]]:
            # not on the nodes held for that pool's own waiting rigid work (no queue jumping)
            self._refresh_holds(r)
            placement = self.clusters[r].place(req, off_held=True)
            if placement is not None:
                jobs.pool[job] = r
                self.spilled += 1
                self._start(job, placement, t)
                return True
        return False

    def _retry_spill(self, t: float) -> None:
        """Rigid jobs still waiting at a control step try the other pools again, oldest first,
        by the queue's backfill rule (`placement.queue.backfill`): a job that may run nowhere
        else (its pod names this GPU model), or whose request has just failed to find room in
        the pools it may go to, is passed over, not waited on. Each request (shape, cores,
        memory, GPU models) is searched once per step until it fails: jobs asking for the same
        find the same room. (Trying only the head of each GPU shape's queue kept a job that may
        run on `P100` waiting behind hundreds that may run only on a `V100`, while `P100` had
        room: `gpuspec33/vcTJs/s197` of #46.)"""
        if not self.inputs.spill:
            return
        for r, (rigid, _) in enumerate(self.queues):
            if rigid:
                self._spill_waiting(r, rigid, t)

    def _spill_waiting(self, r: int, rigid: dict[tuple[int, int], deque], t: float) -> None:
        """Pool r's waiting rigid jobs, oldest first, each that may run elsewhere spilled where
        the pools it may go to have room (`_retry_spill`)."""
        jobs, requests, targets = self.jobs, self.inputs.requests, self.inputs.spill[r]
        failed: set[Any] = set()  # requests that found no room at this step

        def may_fit(entry: tuple[float, int, tuple[int, int]]) -> bool:
            job = entry[1]
            pod = jobs.pod[job]
            return bool(targets[pod]) and job not in self.awaited and requests[pod] not in failed

        def place(entry: tuple[float, int, tuple[int, int]]) -> bool:
            _, job, key = entry
            if not self._spill_from_queue(job, r, t):
                failed.add(requests[jobs.pod[job]])
                return False
            queue = rigid[key]
            queue.remove(job)
            if not queue:
                del rigid[key]
            return True

        backfill(sorted((jobs.arrival[j], j, key) for key, q in rigid.items() for j in q), may_fit, place)

    def _spill_from_queue(self, job: int, r: int, t: float) -> bool:
        gpus = self.jobs.gpus[job]
        if not self._spill(job, t):
            return False
        self.hold_stale[r] = True  # it left pool r's queue
        self.meter.pending(r, RIGID, -gpus)
        return True

    # -- drains ---------------------------------------------------------------------------------
    def _drain_for(self, job: int, t: float) -> bool:
        """Plan drains that make room for a waiting rigid job (its own pool first, then the
        pools it may spill to); True when drains are under way."""
        jobs, drainer = self.jobs, self.drainer
        assert drainer is not None
        if job in self.awaited:
            return True
        req = self.inputs.requests[jobs.pod[job]]
        own = jobs.pool[job]
        plan = None
        others = self.inputs.spill[own][jobs.pod[job]] if self.inputs.spill else ()
        # its own pool first, then the pools it may spill to (the pod names no GPU model)
        for r in (own, *others):
            key = (r, req.num_gpu, req.gpu_milli)
            if self._no_room.get(key) == self.control_step:  # nothing drainable for it until the next step
                continue
            plan = drainer.plan(jobs, self.clusters[r], self.node_jobs[r], req, t)
            if plan is not None:
                break
            self._no_room[key] = self.control_step
        if plan is None:
            return False
        if r != own:
            self._requeue(job, r)
        self.awaited[job] = set(plan.victims)
        # newcomers keep off the node until its drains are done (`keep_off_draining`)
        self.clusters[r].begin_drains(plan.node_row)
        self.drain_room[job] = (r, plan.node_row)
        for victim in plan.victims:
            self.victim_of[victim] = job
            drainer.record_start(jobs, self.clusters[r], victim, t)
            self._stop(victim)
            jobs.state[victim] = DRAINING
            jobs.epoch[victim] += 1  # its finish event is void now
            jobs.remaining[victim] = max(jobs.remaining[victim] - (t - jobs.run_start[victim]), 1.0)
            jobs.drains[victim] += 1
            self.meter.change(r, t, ELASTIC, bill=-jobs.gpus[victim], latent=self.latent[jobs.tenant[victim]])
            self.meter.drains += 1
            self.meter.work_lost_gpu_hours += jobs.gpus[victim] * drainer.seconds / 3600.0
            self._push(t + drainer.seconds, DRAIN_DONE, victim)
        return True

    def _requeue(self, job: int, r: int) -> None:
        """Move a waiting rigid job to pool r's queue (drains make its room there)."""
        self._dequeue(job)
        self.jobs.pool[job] = r
        self.spilled += 1
        self._enqueue(job)

    def _drain_done(self, victim: int, t: float) -> None:
        jobs, drainer = self.jobs, self.drainer
        assert drainer is not None
        r = jobs.pool[victim]
        placement = jobs.placement[victim]
        assert placement is not None
        self.clusters[r].release(self.inputs.requests[jobs.pod[victim]], placement)
        jobs.placement[victim] = None
        self.meter.change(r, t, ELASTIC, alloc=-jobs.gpus[victim], used=-self.pod_use[jobs.pod[victim]])
        drainer.record_done(jobs, victim)
        waiting_for = self.victim_of.pop(victim, None)
        left = self.awaited.get(waiting_for) if waiting_for is not None else None
        victims = [victim]
        if left is not None:
            left.discard(victim)
            if left:  # hold the freed room (and the victim) until every victim is out
                self.parked.setdefault(waiting_for, []).append(victim)
                return
            del self.awaited[waiting_for]
            self._release_drain_room(waiting_for)
            self._place_awaited(waiting_for, t)  # the rigid job it made room for goes first
            victims = self.parked.pop(waiting_for, []) + victims
        self._scan(r, placement.node, t)
        for v in victims:  # drained jobs wait again (they may land anywhere but the room just made)
            self._place_or_queue(v, t)

    def _release_drain_room(self, job: int) -> None:
        """The drains planned for `job` are done, or it started elsewhere: newcomers may use
        their node again."""
        room = self.drain_room.pop(job, None)
        if room is not None:
            r, row = room
            self.clusters[r].end_drains(row)

    def _place_awaited(self, job: int, t: float) -> None:
        """Its drains are done: place the rigid job before the queue scan can hand the room
        to another waiting job (which would send it back to plan drains again)."""
        jobs = self.jobs
        if jobs.state[job] != QUEUED:
            return
        r, req = jobs.pool[job], self.inputs.requests[jobs.pod[job]]
        placement = self.clusters[r].place(req)
        if placement is None:
            return
        self._dequeue(job)
        self._start(job, placement, t)

    def _retry_drains(self, t: float) -> None:
        """At a control step, every rigid job still waiting that is due (`placement.guarantee.
        drain_due`: a later step would be too late, or it needs a whole node) tries the drain
        guardrail (a request shape whose search failed is skipped for the rest of the step,
        `_no_room`). This is the only way in: the live drain planner runs at control-loop ticks
        and a task's arrival does not call it, so a job the pool's own churn starts before its
        drains are due is drained for by nobody."""
        jobs = self.jobs
        due = [
            job
            for r, (rigid, _) in enumerate(self.queues)
            for key in list(rigid)
            for job in rigid[key]
            if job not in self.awaited
            and drain_due(t - jobs.arrival[job], key[0], self.largest_gpus[r], self.drain_after_s)
        ]
        for i in drain_order([t - jobs.arrival[j] for j in due], self.drain_in_time_s, self.late_drains):
            job = due[i]
            if jobs.state[job] == QUEUED and job not in self.awaited:
                self._drain_for(job, t)

    # -- result ---------------------------------------------------------------------------------
    def _result(self, seconds: float) -> StrategyResult:
        s, jobs, meter = self.inputs.settings, self.jobs, self.meter
        end = (self.warmup + s.ticks) * self.tick_s
        waiting = [
            j
            for j in range(len(jobs))
            if jobs.state[j] in (QUEUED, DRAINING) and jobs.first_start[j] != jobs.first_start[j]
        ]
        for job in waiting:  # censored waits: still waiting at the end
            meter.record_wait(end - jobs.arrival[job], jobs.cls[job])
            if jobs.cls[job] == RIGID and end - jobs.arrival[job] > self.inputs.sla_wait_s:
                meter.sla_violation(
                    self.inputs.requests[jobs.pod[job]].num_gpu, self.inputs.pools[jobs.pool[job]].pool_id
                )
        started = sum(1 for v in jobs.first_start if v == v)
        extra = {
            "wall_seconds": round(seconds, 3),
            "policy_calls": int(sum(c.policy_calls for c in self.clusters)),
            "rigid_spilled": self.spilled,
            "opening_jobs": self.opening_jobs,
        }
        summary = getattr(self.strategy, "summary", None)
        if callable(summary):
            extra.update(summary())
        if self.drainer is not None:
            extra["drain_blocked"] = dict(self.drainer.blocked)
        extra.update(self.deferred.summary())
        meter.trim(self.warmup)
        return summarize(
            self.strategy.name,
            meter,
            self.capacity,
            s.ticks * self.tick_s,
            len(jobs),
            started,
            len(waiting),
            extra,
        )


__all__ = ["RUNNING", "RunInputs", "StrategyRun"]
