"""Rigid jobs that cannot be placed at once: spill to another GPU model, then drains.

Part of `engine.StrategyRun` (a mixin, split off to keep modules small). A rigid job whose
pool is full tries the other pools its pod fits (`RunInputs.spill`: nearest list price
first; the trace names no GPU model), off the nodes they hold for their own waiting rigid jobs; failing that, the task-drain guardrail looks for
drainable jobs to drain, in its pool and then in those other pools. Both are tried at every
control-loop tick while it waits (drains only there: the live drain planner runs at those
ticks, not when a task arrives). The room a drain makes is held for the rigid job
until every victim is out: newcomers keep off the node meanwhile
(`placement.guarantee.keep_off_draining`), and drained jobs are re-placed only after it
(best-fit would otherwise put a victim straight back on the node it was drained from).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from market_pipeline.lab.simulate.jobs import DRAINING, QUEUED
from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID
from market_pipeline.placement.guarantee import drain_due
from market_pipeline.placement.queue import backfill

if TYPE_CHECKING:
    from market_pipeline.placement.capacity import Placement

FINISH, DRAIN_DONE = 0, 1


class RigidService:
    """Spill and drain methods of `engine.StrategyRun` (see its attributes there)."""

    inputs: Any
    jobs: Any
    clusters: list[Any]
    meter: Any
    queues: list[tuple[dict[tuple[int, int], deque], dict[tuple[int, int], deque]]]
    node_jobs: list[dict[int, set[int]]]
    drainer: Any
    awaited: dict[int, set[int]]
    victim_of: dict[int, int]
    parked: dict[int, list[int]]
    drain_room: dict[int, tuple[int, int]]
    latent: list[bool]
    spilled: int
    control_step: int
    _no_room: dict[tuple[int, int, int], int]
    hold_stale: list[bool]
    hold_limits: list[int]
    drain_after_s: float
    largest_gpus: list[int]

    def _start(self, job: int, placement: "Placement", t: float) -> None: ...
    def _stop(self, job: int) -> None: ...
    def _scan(self, r: int, row: int, t: float) -> None: ...
    def _enqueue(self, job: int) -> None: ...
    def _dequeue(self, job: int) -> None: ...
    def _place_or_queue(self, job: int, t: float) -> None: ...
    def _push(self, t: float, kind: int, job: int) -> None: ...
    def _refresh_holds(self, r: int) -> None: ...

    # -- spill (rigid jobs only) ---------------------------------------------------------------
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
        for r, (rigid, _) in enumerate(self.queues):
            largest = self.largest_gpus[r]
            for key in list(rigid):
                for job in list(rigid.get(key, ())):
                    if (
                        jobs.state[job] == QUEUED
                        and job not in self.awaited
                        and drain_due(t - jobs.arrival[job], key[0], largest, self.drain_after_s)
                    ):
                        self._drain_for(job, t)
