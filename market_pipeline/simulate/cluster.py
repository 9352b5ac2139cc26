"""One pool's placement state: the shared capacity model and placement policy of the live
pipeline (`market_pipeline.placement`), plus per-node room counters that skip policy calls
which cannot succeed (a policy call scores every node of the pool; the counters are one
vector test)."""

from __future__ import annotations

import numpy as np

from market_pipeline.placement.capacity import MILLI, ClusterCapacity, Placement, PodRequest
from market_pipeline.placement.typical import TypicalPods
from market_pipeline.placement.policies import make_policy
from market_pipeline.simulate.inputs import FleetNodes, PodTable
from market_pipeline.simulate.tenants import Pool


def pod_requests(pods: PodTable) -> list[PodRequest]:
    """One request per pod (the pool's model is fixed by the pool, so no model constraint)."""
    return [PodRequest(int(n), int(m), int(c), int(mem)) for n, m, c, mem in
            zip(pods.num_gpu.tolist(), pods.gpu_milli.tolist(), pods.cpu_milli.tolist(), pods.mem_mib.tolist())]


def typical_pods(requests: list[PodRequest]) -> TypicalPods:
    return TypicalPods.from_requests(requests)


class PoolCluster:
    """Free capacity, placement policy and bounds of one pool."""

    def __init__(self, pool: Pool, nodes: FleetNodes, policy: str, typical: TypicalPods | None,
                 requests: list[PodRequest]) -> None:
        rows = pool.node_rows
        models = tuple(nodes.models[i] for i in rows)
        spec = nodes.spec(pool.model)  # the fleet catalog's spec: NVLink domain, MIG sizes
        mig = {pool.model: spec.mig_slice_sizes} if spec.mig_capable else {}
        domain = {pool.model: spec.nvlink_domain}
        self.pool = pool
        self.requests = requests  # per pod row
        self.cap = ClusterCapacity.build(
            [nodes.node_ids[i] for i in rows], models, nodes.gpus[rows].tolist(), nodes.cpu_milli[rows].tolist(),
            nodes.mem_mib[rows].tolist(), mig_sizes_by_model=mig, nvlink_domain_by_model=domain)
        self.policy = make_policy(policy, typical)
        self.capacity_gpus = float(self.cap.total_gpus())
        # Per node: fully free GPUs and the largest free share of one GPU, kept in step with
        # every allocation and release (one row at a time), so feasibility is a cheap test.
        self.node_full = (self.cap.gpu_free == MILLI).sum(axis=1)
        self.node_best = self.cap.gpu_free.max(axis=1)
        self.policy_calls = 0

    def _update(self, row: int) -> None:
        free = self.cap.gpu_free[row].tolist()  # a handful of slots: Python beats numpy calls here
        self.node_full[row] = free.count(MILLI)
        self.node_best[row] = max(free)

    def might_fit(self, req: PodRequest) -> bool:
        """Whether some node has the GPUs, CPU and memory (exact off MIG; on MIG nodes the
        slice geometry can still refuse, and the policy has the last word)."""
        cap = self.cap
        room = (cap.cpu_free >= req.cpu_milli) & (cap.mem_free >= req.mem_mib) & cap.schedulable
        if req.fractional:
            room &= self.node_best >= req.gpu_milli
        elif req.num_gpu:
            room &= self.node_full >= req.num_gpu
        return bool(room.any())

    def fits_node(self, req: PodRequest, row: int) -> bool:
        """The same test on one node (after a release there, only it can have new room)."""
        cap = self.cap
        if cap.cpu_free[row] < req.cpu_milli or cap.mem_free[row] < req.mem_mib:
            return False
        if req.fractional:
            return bool(self.node_best[row] >= req.gpu_milli)
        return bool(self.node_full[row] >= req.num_gpu)

    def place(self, req: PodRequest) -> Placement | None:
        if not self.might_fit(req):
            return None
        self.policy_calls += 1
        placement = self.policy.choose(self.cap, req)
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

    def gpu_free_row(self, row: int) -> np.ndarray:
        return self.cap.gpu_free[row]
