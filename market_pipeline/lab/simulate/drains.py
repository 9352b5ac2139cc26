"""Task drains in the simulator: which drainable jobs make room for a waiting rigid job.

Room is sought on one node of the pool (a job never spans nodes): the node whose free
capacity plus its drainable jobs' capacity holds the request with the fewest drained
GPUs. Victims are ordered, scored and checked by the live task-drain guardrail
(`candidate_order`, `drainability_score`, `DrainLimits.blockers`: landing cool-down,
per-tenant daily cap, pool disruption budget); a node with a blocked victim is skipped.
The drain takes the configured warn + checkpoint + terminate time; the drained job keeps
its progress (it checkpoints at the warning) and waits again, and the GPU time of the drain
window is counted as work lost.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.drain.limits import (
    TENANT_CAP_WINDOW,
    DrainLedger,
    DrainLimits,
    DrainReason,
    LedgerEntry,
)
from market_pipeline.drain.plan import decision_id_for
from market_pipeline.drain.room import MAX_NODES_TRIED, RoomCandidate, room_victims
from market_pipeline.drain.score import DrainHistory, candidate_order, drainability_score
from market_pipeline.hardware.protocol import ResourceClass, TaskInfo, TaskKind
from market_pipeline.lab.simulate.cluster import PoolCluster
from market_pipeline.lab.simulate.jobs import RUNNING, Jobs
from market_pipeline.placement.capacity import PodRequest

MIN_SCORE = 0.4  # the planner's default SelectionPolicy.min_score


@dataclass(frozen=True)
class DrainPlan:
    node_row: int
    victims: tuple[int, ...]


class DrainController:
    def __init__(
        self,
        config: MarketPipelineConfig,
        epoch: dt.datetime,
        tenant_ids: tuple[str, ...],
        qos_of_pod: np.ndarray,
        tick_minutes: float,
    ) -> None:
        section = config.guardrails.task_drain
        self.limits = DrainLimits.from_config(config)
        self.seconds = (
            section.warn_seconds + section.checkpoint_timeout_seconds + section.terminate_timeout_seconds
        )
        self.epoch = epoch
        self.tenant_ids = tenant_ids
        self.qos_of_pod = qos_of_pod
        self.tick_minutes = tick_minutes
        self.ledger = DrainLedger()
        self._open: dict[int, int] = {}  # job -> ledger index of its pending entry
        self.history: dict[str, DrainHistory] = {}
        self.blocked: dict[str, int] = {}
        self.drained = 0

    def clock(self, now_s: float) -> dt.datetime:
        return self.epoch + dt.timedelta(seconds=now_s)

    def task(self, jobs: Jobs, cluster: PoolCluster, job: int) -> TaskInfo:
        placement = jobs.placement[job]
        assert placement is not None
        node = cluster.node_id(placement.node)
        return TaskInfo(
            task_id=jobs.task_id(job),
            tenant_id=self.tenant_ids[jobs.tenant[job]],
            pool_id=cluster.pool.pool_id,
            node_id=node,
            gpu_uuids=tuple(f"{node}/gpu{g}" for g in placement.gpus),
            gpu_milli=placement.milli,
            kind=TaskKind.TRAINING,
            qos=str(self.qos_of_pod[jobs.pod[job]]),
            priority=0,
            resource_class=ResourceClass.DRAINABLE,
            started_at=self.clock(jobs.run_start[job]),
            checkpointable=True,
        )

    def plan(
        self, jobs: Jobs, cluster: PoolCluster, node_jobs: dict[int, set[int]], req: PodRequest, now_s: float
    ) -> DrainPlan | None:
        """The cheapest node on which drains free room for `req`, with every victim allowed."""
        options = []
        eligible = self._eligible(jobs, now_s)
        for row, members in node_jobs.items():
            running = [j for j in members if jobs.state[j] == RUNNING and eligible(j)]
            if running:
                victims = _victims_on_node(jobs, cluster, row, running, req)
                if victims is not None:
                    options.append((sum(jobs.gpus[v] for v in victims), row, victims))
        options.sort()
        now = self.clock(now_s)
        pool_nodes = cluster.node_count()
        for _, row, victims in options[:MAX_NODES_TRIED]:
            tasks = [self.task(jobs, cluster, v) for v in victims]
            reasons = self._blockers(tasks, now, pool_nodes)
            if not reasons:
                scores = {
                    t.task_id: drainability_score(t, None, self.history.get(t.tenant_id)) for t in tasks
                }
                ordered = candidate_order(tasks, scores)
                by_id = {jobs.task_id(v): v for v in victims}
                return DrainPlan(row, tuple(by_id[t.task_id] for t in ordered))
            for reason in reasons:
                code = reason.split(":", 1)[0]
                self.blocked[code] = self.blocked.get(code, 0) + 1
        return None

    def _eligible(self, jobs: Jobs, now_s: float):
        """The limits' own cool-down and tenant-cap rules, applied before the search so that
        only drainable-now jobs count as room (`blockers` re-checks every chosen victim)."""
        now = self.clock(now_s)
        landed_before = now_s - 60.0 * self.limits.landing_cooldown_minutes
        since = now - TENANT_CAP_WINDOW
        used: dict[int, bool] = {}

        def eligible(job: int) -> bool:
            if jobs.run_start[job] > landed_before:
                return False
            tenant = jobs.tenant[job]
            if tenant not in used:
                count = self.ledger.tenant_drains_since(self.tenant_ids[tenant], since)
                used[tenant] = count < self.limits.tenant_max_drains_per_day
            return used[tenant]

        return eligible

    def _blockers(self, tasks: list[TaskInfo], now: dt.datetime, pool_nodes: int) -> list[str]:
        reasons: list[str] = []
        trial = DrainLedger(list(self.ledger.entries))
        for task in tasks:
            found = self.limits.blockers(
                task, DrainReason.PRESSURE, fleet_now=now, ledger_now=now, ledger=trial, pool_nodes=pool_nodes
            )
            score = drainability_score(task, None, self.history.get(task.tenant_id))
            if score.score < MIN_SCORE:
                found.append(f"low_score: drainability {score.score:.2f} < {MIN_SCORE:.2f}")
            if found:
                reasons.extend(found)
                break
            trial.add(self._entry(task, now))
        return reasons

    def _entry(self, task: TaskInfo, now: dt.datetime) -> LedgerEntry:
        decision = decision_id_for(task, DrainReason.PRESSURE, now, self.tick_minutes)
        return LedgerEntry(decision, task.task_id, task.tenant_id, task.pool_id, task.node_id, now)

    def record_start(self, jobs: Jobs, cluster: PoolCluster, job: int, now_s: float) -> None:
        task = self.task(jobs, cluster, job)
        self._open[job] = len(self.ledger.entries)
        self.ledger.add(self._entry(task, self.clock(now_s)))
        self.drained += 1

    def record_done(self, jobs: Jobs, job: int) -> None:
        index = self._open.pop(job, None)
        if index is not None:
            entry = self.ledger.entries[index]
            self.ledger.entries[index] = replace(entry, outcome="drained")
            tenant = entry.tenant_id
            past = self.history.get(tenant, DrainHistory())
            self.history[tenant] = DrainHistory(past.answered + 1, past.ignored, past.failed)

    def prune(self, now_s: float) -> None:
        """Forget finished entries older than the tenant cap's window (they limit nothing)."""
        horizon = self.clock(now_s) - dt.timedelta(hours=24, seconds=self.limits.decision_ttl_seconds)
        keep = [i for i, e in enumerate(self.ledger.entries) if e.outcome is None or e.decided_at >= horizon]
        if len(keep) == len(self.ledger.entries):
            return
        remap = {old: new for new, old in enumerate(keep)}
        self.ledger = DrainLedger([self.ledger.entries[i] for i in keep])
        self._open = {job: remap[i] for job, i in self._open.items() if i in remap}


def _victims_on_node(
    jobs: Jobs, cluster: PoolCluster, row: int, running: list[int], req: PodRequest
) -> tuple[int, ...] | None:
    """Drainable jobs on the node whose removal lets `req` fit (GPU, CPU, memory), fewest
    GPUs (`drain.room.room_victims`, the live planner's search too); None when none is needed."""
    cap = cluster.cap
    candidates = []
    for job in running:
        placement = jobs.placement[job]
        assert placement is not None
        candidates.append(
            RoomCandidate(
                job,
                placement.gpus,
                placement.milli,
                jobs.gpus[job],
                _cpu(jobs, cluster, job),
                _mem(jobs, cluster, job),
            )
        )
    victims = room_victims(
        cap.gpu_free[row], cap.present[row], int(cap.cpu_free[row]), int(cap.mem_free[row]), candidates, req
    )
    return victims or None


def _cpu(jobs: Jobs, cluster: PoolCluster, job: int) -> int:
    return cluster.requests[jobs.pod[job]].cpu_milli


def _mem(jobs: Jobs, cluster: PoolCluster, job: int) -> int:
    return cluster.requests[jobs.pod[job]].mem_mib
