"""One pool's placement state: the shared capacity model and placement policy of the live
pipeline (`market_pipeline.placement`), plus per-node room counters that skip policy calls
which cannot succeed (a policy call scores every node of the pool; the counters are one
vector test).

Best-fit on pools without MIG GPUs (every openb pool) takes an incremental path,
`IncrementalBestFit`: the live `BestFit` rule (same score expression, evaluated only on the
feasible nodes; same slot choice) over per-node counters kept in step with every allocation
and release, instead of re-deriving them from the (nodes x slots) arrays on every call. It
picks exactly the placement `BestFit.choose` picks (tests/simulate/test_simulate_cluster.py
replays random arrivals and releases through both); the simulator spends most of its time
placing jobs, and this path is ~5x cheaper.
"""

from __future__ import annotations

import numpy as np

from market_pipeline.lab.simulate.inputs import FleetNodes, PodTable
from market_pipeline.lab.simulate.tenants import Pool
from market_pipeline.placement.capacity import MILLI, ClusterCapacity, Placement, PodRequest
from market_pipeline.placement.guarantee import (
    EMPTY_RESERVE_FACTOR,
    choose_outside,
    keep_off_draining,
    kept_empty,
    largest_nodes,
    refilling_nodes,
)
from market_pipeline.placement.policies import make_policy
from market_pipeline.placement.typical import TypicalPods


def pod_requests(pods: PodTable) -> list[PodRequest]:
    """One request per pod (the pool's model is fixed by the pool, so no model constraint)."""
    return [
        PodRequest(int(n), int(m), int(c), int(mem))
        for n, m, c, mem in zip(
            pods.num_gpu.tolist(), pods.gpu_milli.tolist(), pods.cpu_milli.tolist(), pods.mem_mib.tolist()
        )
    ]


def typical_pods(requests: list[PodRequest]) -> TypicalPods:
    return TypicalPods.from_requests(requests)


class IncrementalBestFit:
    """`placement.policies.BestFit` for a capacity without MIG nodes, from counters kept by
    the owner (`PoolCluster`): fully free GPUs, largest free share and free milli per node."""

    name = "best_fit"

    def __init__(self, cap: ClusterCapacity) -> None:
        if cap.any_mig:
            raise ValueError("IncrementalBestFit covers capacities without MIG nodes only")
        # BestFit's normalisation: the largest node's CPU and GPU slots (fixed for a fleet)
        self.cpu_scale = max(int(cap.cpu_total.max()), 1) if cap.n_nodes else 1
        self.gpu_scale = max(int(cap.present.sum(axis=1).max()) * MILLI, 1) if cap.n_nodes else 1
        self.domains = [row.tolist() for row in cap.domain]

    def choose_among(
        self, cap: ClusterCapacity, req: PodRequest, rows: np.ndarray, free_sum: np.ndarray
    ) -> Placement:
        """The placement BestFit picks, given its feasible nodes `rows` (ascending)."""
        gpu_left = free_sum[rows] - req.num_gpu * req.gpu_milli
        score = 0.5 * (cap.cpu_free[rows] - req.cpu_milli) / self.cpu_scale + 0.5 * gpu_left / self.gpu_scale
        node = int(rows[int(np.argmin(score))])
        if req.num_gpu == 0:
            return Placement(node, (), 0)
        free = cap.gpu_free[node].tolist()
        present = cap.present[node].tolist()
        if req.fractional:  # the fullest GPU that fits, lowest slot on a tie
            slot = min((f, s) for s, f in enumerate(free) if present[s] and f >= req.gpu_milli)[1]
            return Placement(node, (slot,), req.gpu_milli)
        return Placement(node, self._whole_slots(node, req.num_gpu, free, present), MILLI)

    def _whole_slots(self, node: int, k: int, free: list[int], present: list[bool]) -> tuple[int, ...]:
        """`policies.whole_gpu_slots`: inside the tightest NVLink domain with room for k, else
        the domains with the most free GPUs first (lower id on a tie)."""
        domain = self.domains[node]
        by_domain: dict[int, list[int]] = {}
        for s, f in enumerate(free):
            if present[s] and f >= MILLI:
                by_domain.setdefault(domain[s], []).append(s)
        roomy = [(len(slots), d) for d, slots in by_domain.items() if len(slots) >= k]
        if roomy:
            return tuple(by_domain[min(roomy)[1]][:k])
        ranked = [s for d in sorted(by_domain, key=lambda d: (-len(by_domain[d]), d)) for s in by_domain[d]]
        return tuple(ranked[:k])


class PoolCluster:
    """Free capacity, placement policy and bounds of one pool."""

    def __init__(
        self,
        pool: Pool,
        nodes: FleetNodes,
        policy: str,
        typical: TypicalPods | None,
        requests: list[PodRequest],
        reserve_nodes: int = 0,
        refill_reserve: bool = False,
    ) -> None:
        rows = pool.node_rows
        models = tuple(nodes.models[i] for i in rows)
        spec = nodes.spec(pool.model)  # the fleet catalog's spec: NVLink domain, MIG sizes
        mig = {pool.model: spec.mig_slice_sizes} if spec.mig_capable else {}
        domain = {pool.model: spec.nvlink_domain}
        self.pool = pool
        self.requests = requests  # per pod row
        self.cap = ClusterCapacity.build(
            [nodes.node_ids[i] for i in rows],
            models,
            nodes.gpus[rows].tolist(),
            nodes.cpu_milli[rows].tolist(),
            nodes.mem_mib[rows].tolist(),
            mig_sizes_by_model=mig,
            nvlink_domain_by_model=domain,
        )
        self.policy = make_policy(policy, typical)
        self.fast = IncrementalBestFit(self.cap) if policy == "best_fit" and not self.cap.any_mig else None
        self.capacity_gpus = float(self.cap.total_gpus())
        # Per node: fully free GPUs, the largest free share of one GPU and the free milli,
        # kept in step with every allocation and release (one row at a time), so feasibility
        # is a cheap test.
        self.node_full = (self.cap.gpu_free == MILLI).sum(axis=1)
        self.node_best = self.cap.gpu_free.max(axis=1)
        self.node_free = self.cap.gpu_free.sum(axis=1).astype(np.int64)
        self.policy_calls = 0
        # Whole-node headroom for rigid work (`placement.guarantee.kept_empty`): while no more
        # than `reserve` of the pool's largest nodes are empty, elastic jobs may not take one.
        # The count of empty largest nodes, kept in step, skips the call where it keeps none.
        self.node_gpus = self.cap.present.sum(axis=1)
        self.top = largest_nodes(self.cap)
        # at most one per EMPTY_RESERVE_FACTOR of the pool's largest nodes (small pools keep none)
        self.reserve = min(int(reserve_nodes), int(self.top.sum()) // EMPTY_RESERVE_FACTOR)
        self.free_top = int((self.top & (self.node_full == self.node_gpus)).sum())
        # while fewer are empty, the largest nodes without rigid work nearest to empty take no
        # elastic job either (`placement.guarantee.refilling_nodes`): rigid jobs per node,
        # kept in step by the engine as rigid jobs start and end
        self.refill_reserve = refill_reserve
        self.rigid_jobs = np.zeros(self.cap.n_nodes, dtype=np.int64)
        # nodes held for this pool's waiting rigid jobs (`placement.guarantee`): no elastic job there
        self.held = np.zeros(self.cap.n_nodes, dtype=bool)
        # nodes closed to elastic work while rigid work waits (`placement.guarantee.closed_nodes`;
        # the held nodes are among them)
        self.closed = np.zeros(self.cap.n_nodes, dtype=bool)
        # nodes kept from elastic work for the pool's forecast rigid arrivals
        # (`placement.guarantee.reserved_nodes`, re-picked every control step and when rigid work takes it)
        self.reserved = np.zeros(self.cap.n_nodes, dtype=bool)
        # drains under way per node for waiting rigid jobs (`placement.guarantee.keep_off_draining`):
        # newcomers keep off such a node until its drains are done
        self.drains_under_way = np.zeros(self.cap.n_nodes, dtype=np.int64)
        self.drains_total = 0

    def begin_drains(self, row: int) -> None:
        """Drains for a waiting rigid job start emptying node `row`."""
        self.drains_under_way[row] += 1
        self.drains_total += 1

    def end_drains(self, row: int) -> None:
        """The drains planned on node `row` for a job are done, or the job started elsewhere."""
        self.drains_under_way[row] -= 1
        self.drains_total -= 1

    def _update(self, row: int) -> None:
        free = self.cap.gpu_free[row].tolist()  # a handful of slots: Python beats numpy calls here
        full = free.count(MILLI)
        if self.top[row]:  # keep the count of entirely free largest nodes in step
            self.free_top += int(full == self.node_gpus[row]) - int(
                self.node_full[row] == self.node_gpus[row]
            )
        self.node_full[row] = full
        self.node_best[row] = max(free)
        self.node_free[row] = sum(free)

    def _room(self, req: PodRequest) -> np.ndarray:
        cap = self.cap
        room = (cap.cpu_free >= req.cpu_milli) & (cap.mem_free >= req.mem_mib) & cap.schedulable
        if req.fractional:
            room &= self.node_best >= req.gpu_milli
        elif req.num_gpu:
            room &= self.node_full >= req.num_gpu
        return room

    def fits_node(self, req: PodRequest, row: int) -> bool:
        """The same test on one node (after a release there, only it can have new room)."""
        cap = self.cap
        if cap.cpu_free[row] < req.cpu_milli or cap.mem_free[row] < req.mem_mib:
            return False
        if req.fractional:
            return bool(self.node_best[row] >= req.gpu_milli)
        return bool(self.node_full[row] >= req.num_gpu)

    def place(
        self, req: PodRequest, elastic: bool = False, off_held: bool | None = None, newcomer: bool = False
    ) -> Placement | None:
        """Place `req` by the pool's policy; elastic work keeps off the empty nodes kept for
        whole-node rigid work (`kept_empty`) and the nodes refilling them (`refilling_nodes`), the
        nodes reserved for forecast rigid arrivals and the nodes closed to it while rigid work
        waits, and (like any request with `off_held`)
        off the nodes held for waiting rigid jobs. Newcomers (elastic work, `off_held` or
        `newcomer`: not a waiting rigid job) keep off the nodes being emptied by drains for
        waiting rigid jobs."""
        off_held = elastic if off_held is None else off_held
        room = self._room(req)
        if elastic and self.reserve and self.free_top <= self.reserve:  # else none is kept
            empty = self.node_full == self.node_gpus
            room &= ~kept_empty(self.cap, self.reserve, self.top, empty)
            if self.refill_reserve and self.free_top < self.reserve:
                room &= ~refilling_nodes(
                    self.cap, self.reserve, self.rigid_jobs > 0, self.top, empty, self.node_free
                )
        keep_off = (self.held | self.closed | self.reserved) if elastic else self.held
        if not (off_held or elastic):
            keep_off = np.zeros_like(keep_off)
        if self.drains_total and (elastic or off_held or newcomer):
            keep_off = keep_off_draining(keep_off, self.drains_under_way > 0)
        off_any = bool(keep_off.any())
        if off_any:
            room &= ~keep_off
        if self.fast is not None:  # off MIG the room test is BestFit's feasibility, exactly
            rows = np.flatnonzero(room)
            if rows.size == 0:
                return None
            self.policy_calls += 1
            placement = self.fast.choose_among(self.cap, req, rows, self.node_free)
        else:
            if not room.any():
                return None
            self.policy_calls += 1
            placement = (
                choose_outside(self.policy, self.cap, req, keep_off)
                if off_any
                else self.policy.choose(self.cap, req)
            )
        if placement is not None:
            self.cap.allocate(req, placement)
            self._update(placement.node)
        return placement

    def release(self, req: PodRequest, placement: Placement) -> None:
        self.cap.release(req, placement)
        self._update(placement.node)

    def free_gpus(self) -> float:
        return float(self.cap.gpu_free.sum()) / MILLI

    def node_id(self, row: int) -> str:
        return self.cap.node_ids[row]

    def node_count(self) -> int:
        return self.cap.n_nodes
