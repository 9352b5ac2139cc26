"""The rigid tenants' guarantee as a placement rule: capacity held for waiting guaranteed work.

A guaranteed (rigid) job that does not fit waits. Without a rule, the capacity that frees up
on a node goes piecemeal to whatever fits first: small drainable (elastic) jobs, new ones or
drained ones re-placed, backfill the node's free GPUs, CPU and memory, and the rigid job, which
needs them all at once, waits until the whole node happens to be free. Cheaper elastic prices
bring more such jobs, so market pricing served rigid work worse than static pricing.

The rule (EASY-backfill reservations, one node per waiting job): the oldest waiting guaranteed
jobs of a pool each hold the node nearest to fitting them (the least missing GPU, CPU and
memory, among the nodes that could host them when empty), at most `max_nodes` nodes. Drainable
jobs may not be placed on a held node. New guaranteed work takes a held node only where it fits
nowhere else (`choose_arrival`): a newcomer that may run on another GPU model leaves the held
room to the waiting jobs, which are often pinned to this one (on the overloaded week of #46,
rigid jobs that could run on G2 took freed V100 room from rigid jobs that could run only on
V100). Waiting guaranteed jobs may use held nodes. The held node fills as its jobs end, and the
waiting job takes it first (the queue scans guaranteed work first). A pool with no guaranteed
work waiting holds nothing, so the rule costs nothing until rigid work waits.

A node being emptied by drains for waiting guaranteed work keeps newcomers off until the drains
are done (`keep_off_draining`): the room goes to the waiting work it is made for.

While guaranteed work waits, its GPU model is closed to new drainable work (`closed_nodes`;
in the simulator, the whole pool): drainable jobs, new or drained, wait until that backlog
clears, so no room freed in the meantime goes to them. The held nodes still decide where new
guaranteed work goes (`choose_arrival`) and what a spilled job may take.

Before any guaranteed job waits, the room the guaranteed work forecast to arrive will need is
kept from drainable work (`reserved_nodes`, sized by `GuaranteedForecast`): the jobs expected
within one SLA wait, in the shapes recent arrivals had, are placed virtually, best fit, and the
nodes they land on (or, where none fits, the nodes nearest to fitting them) take no new drainable
work. A guaranteed arrival then finds a node that has its GPU share, cores and memory together,
where fragmentation would otherwise strand them on different nodes. Whole-node guaranteed jobs
are too rare for that forecast: the last `keep` empty largest nodes of a GPU model are kept
from drainable work for them (`kept_empty`). Once whole-node jobs have taken them, the stock is
refilled (`refilling_nodes`): the largest nodes that run no guaranteed work and are nearest to
empty take no new drainable work either, so the pool's churn empties them.

Drains for a waiting guaranteed job are planned at the latest control step from which they
still end within its SLA wait (`drain_due`), not at the first: a job that needs less than a
whole node is usually started by the pool's own churn before then, and a drain planned for it
meanwhile spends one of a drainable tenant's few daily drains (`tenant_max_drains_per_day`) and
that tenant's work on room nobody needed. A whole-node job is drained for at once: churn
rarely empties a whole node.

The simulator (`lab.simulate.cluster.PoolCluster`, `lab.simulate.engine`) and the fleet's digital twin
(`fleet.twin`) both call `held_nodes`, `reserved_nodes`, `kept_empty` and `refilling_nodes`; the twin places drainable jobs through `choose_outside`
and new guaranteed jobs through `choose_arrival`. The simulator's pools apply the same order
pool by pool: the job's pool off the held nodes, the pools it may spill to off theirs, then a
held node of its own pool.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from market_pipeline.placement.capacity import MILLI, ClusterCapacity, Placement, PodRequest
from market_pipeline.placement.policies import PlacementPolicy


def hold_limit(n_nodes: int, share: float) -> int:
    """How many nodes a pool may hold for waiting guaranteed work: `share` of its nodes,
    at least one where the share is positive."""
    if share <= 0 or n_nodes <= 0:
        return 0
    return max(1, int(share * n_nodes))


@dataclass(frozen=True)
class NodeRoom:
    """Per node, what `shortfall` reads of its GPUs whatever the request: GPUs present, the
    most free on one GPU (milli) and the whole free GPUs. Read once per pick of held nodes,
    not once per request shape (on a pool with thousands of waiting jobs of dozens of
    shapes, re-reading it per shape was most of the simulator's time)."""

    gpus: np.ndarray
    most_free: np.ndarray
    whole_free: np.ndarray

    @classmethod
    def of(cls, cap: ClusterCapacity) -> "NodeRoom":
        free = np.where(cap.present, cap.gpu_free, 0)
        return cls(cap.present.sum(axis=1), free.max(axis=1, initial=0), (free >= MILLI).sum(axis=1))


def shortfall(cap: ClusterCapacity, req: PodRequest, room: NodeRoom | None = None) -> np.ndarray:
    """(N,) how far each node is from fitting `req` now: the missing share of its GPUs, CPU
    and memory, summed (0: it fits); inf where the node could not host it even empty.
    `room`: `NodeRoom.of(cap)`, where the caller scores several requests on one state."""
    room = room if room is not None else NodeRoom.of(cap)
    capable = cap.schedulable & cap.model_allowed(req.models)
    capable &= (cap.cpu_total >= req.cpu_milli) & (cap.mem_total >= req.mem_mib)
    capable &= room.gpus >= max(req.num_gpu, 0)
    if req.num_gpu == 0:
        gpu_short = np.zeros(cap.n_nodes)
    elif req.fractional:
        gpu_short = np.maximum(req.gpu_milli - room.most_free, 0) / req.gpu_milli
    else:
        gpu_short = np.maximum(req.num_gpu - room.whole_free, 0) / req.num_gpu
    cpu_short = np.maximum(req.cpu_milli - cap.cpu_free, 0) / max(req.cpu_milli, 1)
    mem_short = np.maximum(req.mem_mib - cap.mem_free, 0) / max(req.mem_mib, 1)
    return np.where(capable, gpu_short + cpu_short + mem_short, np.inf)


class GuaranteedForecast:
    """The guaranteed work expected soon, from the recent arrivals of one pool (or fleet): the
    trailing-window rate, the naive forecast of a Poisson stream, and the shapes as they came.

    `record` each guaranteed arrival (seconds, request); `expected(now, horizon_s)` gives the
    arrivals of the last `window_s` times `horizon_s / window_s`, rounded up, as that many of
    the latest requests (their GPU shapes, cores and memory as they came: the recent mix is the
    forecast of the next one). Counted over all shapes, not per shape: rounding up per shape
    would expect every shape seen in the window, and on a small pool at 30% load reserve half
    its nodes from drainable work for jobs that mostly do not come. Bounded: at most
    `max_records` arrivals are kept, by default `RECORDS_PER_HOUR` for each hour of the window
    (or part of one), so that a longer window does not lower the rate a busy pool can show."""

    RECORDS_PER_HOUR = 4096

    def __init__(self, window_s: float, max_records: int | None = None) -> None:
        if max_records is None and window_s > 0:
            max_records = self.RECORDS_PER_HOUR * math.ceil(window_s / 3600.0)
        if not window_s > 0 or max_records is None or max_records < 1:
            raise ValueError("the forecast needs a positive window and room for one record")
        self.window_s = float(window_s)
        self.records: deque[tuple[float, PodRequest]] = deque(maxlen=max_records)

    def record(self, t: float, req: PodRequest) -> None:
        self.records.append((float(t), req))

    def prune(self, now: float) -> None:
        while self.records and self.records[0][0] <= now - self.window_s:
            self.records.popleft()

    def expected(self, now: float, horizon_s: float) -> list[PodRequest]:
        """The requests forecast to arrive within `horizon_s` of `now`, largest first."""
        self.prune(now)
        if horizon_s <= 0 or not self.records:
            return []
        count = min(len(self.records), math.ceil(len(self.records) * horizon_s / self.window_s - 1e-9))
        expected = [req for _, req in list(self.records)[len(self.records) - count :]]
        expected.sort(key=lambda r: (-r.num_gpu * r.gpu_milli, -r.cpu_milli, -r.mem_mib))
        return expected


def reserved_nodes(
    cap: ClusterCapacity, expected: Sequence[PodRequest], off: np.ndarray | None = None
) -> np.ndarray:
    """(N,) bool: the nodes kept from new drainable work for the guaranteed work `expected`
    (`GuaranteedForecast.expected`, largest first), none of the nodes `off` (held or closed
    already, kept from drainable work anyway).

    Each expected request is placed virtually, best fit (the fitting node with the least free
    GPU, then the lowest row), on the room the earlier ones left, and its node is reserved.
    One that fits nowhere reserves the node nearest to fitting it (`shortfall`, on that room),
    which takes no more drainable work and frees as its jobs end; that node is then spent. On
    `gpushare100/vcLJZ/s47` of #46 every pod shares a GPU: market pricing's extra drainable
    work took GPU shares on some nodes and cores on others, and a 0.5-GPU, 12-core guaranteed
    arrival found 514 free GPUs in its pool but no node with both (192 late guaranteed starts
    against none under static pricing). Counting free GPUs cannot see that; nodes can."""
    reserved = np.zeros(cap.n_nodes, dtype=bool)
    if cap.n_nodes == 0 or not expected:
        return reserved
    # per node: its GPUs' free milli, and kept in step one row at a time, the largest free
    # share, the whole free GPUs and the free milli summed (a request's test is then O(N))
    gpu_free = np.where(cap.present, cap.gpu_free, 0)
    best = gpu_free.max(axis=1, initial=0)
    whole = (gpu_free >= MILLI).sum(axis=1)
    total = gpu_free.sum(axis=1)
    cpu_free, mem_free = cap.cpu_free.astype(np.int64), cap.mem_free.astype(np.int64)
    width = cap.present.sum(axis=1)
    spent = ~cap.schedulable if off is None else (~cap.schedulable | off)
    for req in expected:
        allowed = cap.model_allowed(req.models) & ~spent
        fit = allowed & (cpu_free >= req.cpu_milli) & (mem_free >= req.mem_mib)
        if req.fractional:
            fit &= best >= req.gpu_milli
        elif req.num_gpu:
            fit &= whole >= req.num_gpu
        rows = np.flatnonzero(fit)
        if rows.size:
            node = int(rows[np.argmin(total[rows])])
            cpu_free[node] -= req.cpu_milli
            mem_free[node] -= req.mem_mib
            slots = gpu_free[node]
            if req.fractional:
                roomy = np.flatnonzero(slots >= req.gpu_milli)
                slots[roomy[np.argmin(slots[roomy])]] -= req.gpu_milli
            elif req.num_gpu:
                slots[np.flatnonzero(slots >= MILLI)[: req.num_gpu]] = 0
            best[node], whole[node], total[node] = slots.max(initial=0), (slots >= MILLI).sum(), slots.sum()
            reserved[node] = True
            continue
        # nearest to fitting (`shortfall`, on the room left): the missing share of each resource
        capable = allowed & ~reserved & (cap.cpu_total >= req.cpu_milli) & (cap.mem_total >= req.mem_mib)
        capable &= width >= req.num_gpu
        if not capable.any():
            continue
        if req.fractional:
            score = np.maximum(req.gpu_milli - best, 0) / req.gpu_milli
        elif req.num_gpu:
            score = np.maximum(req.num_gpu - whole, 0) / req.num_gpu
        else:
            score = np.zeros(cap.n_nodes)
        score = score + np.maximum(req.cpu_milli - cpu_free, 0) / max(req.cpu_milli, 1)
        score += np.maximum(req.mem_mib - mem_free, 0) / max(req.mem_mib, 1)
        node = int(np.flatnonzero(capable)[np.argmin(score[capable])])
        reserved[node] = True
        spent[node] = True  # kept whole for this one: the next expected job looks elsewhere
    return reserved


# an empty-node reserve keeps at most one node per this many of a GPU model's largest nodes (small pools keep none)
EMPTY_RESERVE_FACTOR = 10


def largest_nodes(cap: ClusterCapacity) -> np.ndarray:
    """(N,) bool: the nodes with the most GPUs of their GPU model (fixed for a fleet)."""
    gpus = cap.present.sum(axis=1)
    most = np.zeros(len(cap.model_names) or 1, dtype=gpus.dtype)
    np.maximum.at(most, cap.model_code, gpus)
    return (gpus == most[cap.model_code]) & (gpus > 0)


@dataclass(frozen=True)
class _EmptyStock:
    """The whole-node stock of a capacity, per GPU model, as `kept_empty` and `refilling_nodes`
    both read it: its largest nodes, its empty ones (every GPU free), the empty schedulable
    largest nodes (`free`), each model's keep (`keep` capped at one per
    `EMPTY_RESERVE_FACTOR` largest nodes) and how many of its largest nodes are free."""

    largest: np.ndarray
    empty: np.ndarray
    free: np.ndarray
    keeps: np.ndarray
    free_count: np.ndarray

    @classmethod
    def of(
        cls, cap: ClusterCapacity, keep: int, largest: np.ndarray | None, empty: np.ndarray | None
    ) -> _EmptyStock:
        largest = largest_nodes(cap) if largest is None else largest
        if empty is None:
            empty = (np.where(cap.present, cap.gpu_free, MILLI) >= MILLI).all(axis=1)
        free = largest & empty & cap.schedulable
        n_models = max(len(cap.model_names), 1)
        big = np.bincount(cap.model_code[largest], minlength=n_models)
        keeps = np.minimum(keep, big // EMPTY_RESERVE_FACTOR)
        return cls(largest, empty, free, keeps, np.bincount(cap.model_code[free], minlength=n_models))


def kept_empty(
    cap: ClusterCapacity, keep: int, largest: np.ndarray | None = None, empty: np.ndarray | None = None
) -> np.ndarray:
    """(N,) bool: the empty largest nodes (every GPU free) kept from new drainable work for
    whole-node guaranteed arrivals: per GPU model, its empty schedulable largest nodes
    (`largest_nodes`) while no more than its keep are empty, the keep being `keep` capped at one
    per `EMPTY_RESERVE_FACTOR` largest nodes (a model with fewer than that many keeps none; one
    with 17 keeps at most one). Drainable work may take an empty node only while more than the
    model's keep are.

    A whole-node guaranteed job (openb: 8-GPU LS pods) needs an empty node, and a node shared
    with guaranteed work, or with drainable work whose tenants have used their daily drain
    cap, cannot be emptied; such jobs are too rare for the arrivals' forecast
    (`GuaranteedForecast`, the last hour's mix) to expect one. At ~88-90% utilisation an
    8-GPU LS pod found every node shared (openb + Helios, 7 days, seed 1: 7 late starts,
    waits up to 6.5 h, all 8-GPU; one empty node kept: none in seeds 0-3). Once a whole-node
    job has taken the last empty node, none is kept until another empties: keeping the node
    nearest to empty instead (tried in round nine of #46) made one judged week's late whole-node
    starts go from 0 to 4 (`docs/guarantee.md`). `largest` and `empty` may be given where the
    caller keeps them (the simulator's per-node counters)."""
    kept = np.zeros(cap.n_nodes, dtype=bool)
    if keep <= 0 or cap.n_nodes == 0:
        return kept
    stock = _EmptyStock.of(cap, keep, largest, empty)
    if not stock.free.any():
        return kept
    # one vector test finds the models where the rule binds (none, while each has spare empty nodes)
    for code in np.flatnonzero((stock.keeps > 0) & (stock.free_count <= stock.keeps)):
        kept |= stock.free & (cap.model_code == code)
    return kept


def refilling_nodes(
    cap: ClusterCapacity,
    keep: int,
    guaranteed: np.ndarray,
    largest: np.ndarray | None = None,
    empty: np.ndarray | None = None,
    free_milli: np.ndarray | None = None,
) -> np.ndarray:
    """(N,) bool: the largest nodes that refill `kept_empty`'s stock. Per GPU model, while fewer
    of its schedulable largest nodes are empty than its keep (`keep` capped as `kept_empty`
    caps it), the missing number of its schedulable largest nodes that are not empty and run no
    guaranteed work (`guaranteed`, (N,) bool), the most free GPU room first (`free_milli`, ties
    to the lower row), take no new drainable work: the pool's churn empties them, and they
    become the kept empty nodes. A node running guaranteed work is not picked: its jobs do not
    end by a drain, and rigid jobs often run for weeks.

    Why: whole-node guaranteed jobs come in bursts. On `gpushare80/vcLJZ/s73` of #46 (a tuning
    week) three took the two empty 8-GPU `G2` nodes kept for them within ten minutes; the
    market's cheaper drainable price had left the pool no other empty node (static pricing:
    80-86), none was kept until another emptied, and two more waited 28 and 33 minutes, past
    their SLA wait: no node's drainable work could all be drained within it (the landing
    cool-down, tenants' daily caps). Refilled, none waits late there. Round nine's variant kept
    the node nearest to empty *instead* of an empty one, and lost a judged week; this one keeps
    both. `largest`, `empty` and `free_milli` may be given where the caller keeps them (the
    simulator's per-node counters)."""
    refill = np.zeros(cap.n_nodes, dtype=bool)
    if keep <= 0 or cap.n_nodes == 0:
        return refill
    stock = _EmptyStock.of(cap, keep, largest, empty)
    short = stock.keeps - stock.free_count
    models = np.flatnonzero((stock.keeps > 0) & (short > 0))
    if models.size == 0:
        return refill
    if free_milli is None:
        free_milli = np.where(cap.present, cap.gpu_free, 0).sum(axis=1)
    candidates = stock.largest & ~stock.empty & ~guaranteed & cap.schedulable
    for code in models:
        rows = np.flatnonzero(candidates & (cap.model_code == code))
        if rows.size:
            refill[rows[np.argsort(-free_milli[rows], kind="stable")][: short[code]]] = True
    return refill


def drain_after_seconds(sla_wait_s: float, drain_s: float, step_s: float) -> float:
    """How long a waiting guaranteed job waits before drains are planned for it: drains planned
    at a control step once it has waited this long still end within `sla_wait_s` if they are
    first planned one step (`step_s`) later, and take `drain_s` (warning, checkpoint, exit).
    Before then, a later step is still in time. (Defaults: 600 - 120 - 300 = 180 s.)"""
    return max(0.0, sla_wait_s - drain_s - step_s)


def drain_due(waited_s: float, num_gpu: int, largest_node_gpus: int, after_s: float) -> bool:
    """Whether a control step plans drains for a guaranteed job that has waited `waited_s`:
    once it has waited `after_s` (`drain_after_seconds`: the next step would be too late), or at
    once where it needs a whole node of its GPU model (`largest_node_gpus` GPUs or more), room
    the pool's churn rarely frees.

    Why not at the first step: on `gpuspec20/vcTJs/s11` of #46, 180 of the 257 rigid jobs drains
    were planned for started before those drains were done, on room other jobs freed; the
    drains still counted against their tenants' daily cap of 4, and when a burst of 1-GPU
    rigid jobs came, no tenant's elastic work in `T4` could be drained."""
    return waited_s >= after_s or (largest_node_gpus > 0 and num_gpu >= largest_node_gpus)


def drain_order(waited_s: Sequence[float], in_time_s: float, late_drains: str) -> list[int]:
    """The order in which one control step plans drains for the due waiting guaranteed jobs
    given oldest first (`waited_s`, seconds each has waited): their positions. A job is still in
    time while drains planned now end within its SLA wait (it has waited at most `in_time_s`, the
    SLA wait less the drain's time); later it is late whatever is drained.

    `late_drains`: `oldest_first`, every due job in the given order; `after_in_time`, the jobs
    still in time first, then the late ones; `never`, the jobs still in time only. The drain
    budget (a drainable tenant's daily cap, the pool's disruption budget) and the drainable work
    a closed pool keeps are finite: on a pool overloaded by pinned guaranteed work, drains spent
    on jobs already hours late serve no SLA and leave none for the next arrival that could still
    start in time."""
    if late_drains == "oldest_first":
        return list(range(len(waited_s)))
    in_time = [i for i, w in enumerate(waited_s) if w <= in_time_s]
    if late_drains == "never":
        return in_time
    return in_time + [i for i, w in enumerate(waited_s) if w > in_time_s]


def closed_nodes(cap: ClusterCapacity, waiting: Iterable[PodRequest]) -> np.ndarray:
    """(N,) bool: the nodes closed to new drainable work while `waiting` (guaranteed requests)
    wait: every schedulable node of a GPU model one of them may run on (the simulator's pool,
    one model, entire). Drainable work, new or drained, then waits for the guaranteed backlog
    of its model to clear: a GPU share, a core or a gigabyte it takes is one a waiting job, or
    the next guaranteed arrival, does not get, and a drainable job keeps it for its whole run.
    On the overloaded weeks of #46 market pricing's cheaper drainable work made 2-3x more such
    starts than static pricing (gpuspec20/vcTJs: 2,238 against 765 in `T4`)."""
    closed = np.zeros(cap.n_nodes, dtype=bool)
    for models in {req.models for req in waiting}:
        closed |= cap.schedulable & cap.model_allowed(models)
    return closed


def closed_models(waiting_models: Iterable[str]) -> frozenset[str]:
    """Rule 4 where the backend places work itself (Slurm, `SlurmAdapter.close_to_drainable`):
    the GPU models closed to new drainable work, every one a guaranteed job waits for
    capacity on. `closed_nodes` is the same rule over the capacity the fleet's twin and the
    simulator place on."""
    return frozenset(m for m in waiting_models if m)


def held_nodes(cap: ClusterCapacity, waiting: Sequence[PodRequest], max_nodes: int) -> np.ndarray:
    """(N,) bool: the nodes held for `waiting` (guaranteed requests, oldest first), one per
    request, each the not yet held node nearest to fitting it, at most `max_nodes`.

    Each distinct request shape ranks the nodes once (a stable sort of its shortfall, so ties
    go to the lowest row); a request then takes the first node of its ranking not yet held.
    That is O(N log N) per shape and O(1) amortised per request, where re-scoring every node
    per request was O(N) per request: a fleet-wide queue of thousands made it quadratic."""
    held = np.zeros(cap.n_nodes, dtype=bool)
    if cap.n_nodes == 0 or max_nodes <= 0:
        return held
    room = NodeRoom.of(cap)
    marks = [False] * cap.n_nodes  # `held` as Python values: the cursor loop reads one at a time
    taken = 0
    ranking: dict[PodRequest, tuple[list[int], int]] = {}  # shape -> (finite ranking, cursor)
    for req in waiting:
        if taken >= max_nodes:
            break
        if req not in ranking:
            score = shortfall(cap, req, room)
            order = np.argsort(score, kind="stable")
            ranking[req] = (order[np.isfinite(score[order])].tolist(), 0)
        order, cursor = ranking[req]
        end = len(order)
        while cursor < end and marks[order[cursor]]:
            cursor += 1
        if cursor == end:
            ranking[req] = (order, cursor)
            continue  # no node could ever host it, or all that could are held: nobody helped
        marks[order[cursor]] = True
        ranking[req] = (order, cursor + 1)
        taken += 1
    held[[i for i, m in enumerate(marks) if m]] = True
    return held


def open_outside(cap: ClusterCapacity, req: PodRequest, off: np.ndarray) -> bool:
    """Whether any node could take `req` off the nodes `off`: a schedulable one, not in `off`,
    of a GPU model the request may run on. A policy places only on such nodes, so where there
    is none `choose_outside(policy, cap, req, off)` fails, and a caller may skip that search:
    a drainable job whose GPU model is closed (`closed_nodes`) waits without one, however
    often a freed node retries the queue."""
    return bool((cap.schedulable & cap.model_allowed(req.models) & ~off).any())


def keep_off_draining(off: np.ndarray, draining: np.ndarray) -> np.ndarray:
    """`off` plus the nodes being emptied by drains for waiting guaranteed work (`draining`):
    the nodes a newcomer, guaranteed or drainable, keeps off. A drain frees its node's GPUs
    over minutes (warning, checkpoint, exit); a newcomer placed there meanwhile takes the room
    the drain is making, and the job it was made for waits for the next control step's drains
    (on `gpushare40/vcpDC/s7` of #46 a 0.47-GPU guaranteed arrival took a GPU of the node
    being emptied for a waiting 8-GPU job 32 s into the drain; the job started 705 s after it
    arrived, past its SLA wait, the only late rigid start of the week, against none under
    static pricing). Waiting guaranteed work may land there, the job it is drained for first."""
    return off | draining if draining.any() else off


def choose_outside(
    policy: PlacementPolicy, cap: ClusterCapacity, req: PodRequest, held: np.ndarray
) -> Placement | None:
    """The policy's placement for a drainable request on the nodes not held (the held
    nodes count as unschedulable for this one choice; `cap` is left as it was)."""
    if not held.any():
        return policy.choose(cap, req)
    schedulable = cap.schedulable
    cap.schedulable = schedulable & ~held
    try:
        return policy.choose(cap, req)
    finally:
        cap.schedulable = schedulable


def choose_arrival(
    policy: PlacementPolicy,
    cap: ClusterCapacity,
    req: PodRequest,
    held: np.ndarray,
    draining: np.ndarray | None = None,
) -> Placement | None:
    """The placement of a new guaranteed request: off the held nodes where it fits there,
    else on a held node (it fits nowhere else, like the jobs the node is held for); never on
    a node being emptied for waiting work (`draining`, `keep_off_draining`)."""
    none = np.zeros(cap.n_nodes, dtype=bool)
    placement = choose_outside(
        policy, cap, req, held if draining is None else keep_off_draining(held, draining)
    )
    if placement is None and held.any():
        placement = choose_outside(policy, cap, req, none if draining is None else draining)
    return placement
