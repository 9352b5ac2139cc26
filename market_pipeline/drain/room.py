"""Room for a waiting guaranteed request on one node: which drainable work to drain.

The rigid guarantee (#46): guaranteed work that cannot be placed gets room by draining
drainable work. The simulator (`lab.simulate.drains`) and the live drain planner
(`drain.triggers.GuaranteedWaiting`) both ask this one search, node by node, and drain on the
node whose answer costs the fewest GPUs; the guardrail (limits, budget, score) is checked by
each caller after the search.

The search, for one node:
- a fractional request (one GPU, under 1000 milli) takes the present slot that frees enough
  with the least drainable milli on it; there it drains the largest tasks first until the
  request fits (no drain on the GPU side when some slot has the room already);
- a whole-GPU request takes the slots that become wholly free when their drainable tasks
  leave, those with the least drainable milli first, and drains everything on them;
- then, when CPU or memory is still short, the smallest remaining candidates until it fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from market_pipeline.placement.capacity import MILLI, PodRequest

MAX_NODES_TRIED = 8  # nodes whose victims are checked against the limits, cheapest first


@dataclass(frozen=True)
class RoomCandidate:
    """One drainable task on the node, as the search sees it.

    `key` is the caller's handle (a job row, an index into its task list): integer keys keep
    the search deterministic where candidates tie. `gpus` is what draining it costs (the
    caller's count: a MIG instance reserves more milli than its request asks)."""

    key: int
    slots: tuple[int, ...]  # the node's GPU slots it holds
    milli: int  # per slot
    gpus: float
    cpu_milli: int = 0
    mem_mib: int = 0


def room_victims(
    gpu_free: np.ndarray,
    present: np.ndarray,
    cpu_free: int,
    mem_free: int,
    candidates: Sequence[RoomCandidate],
    req: PodRequest,
) -> tuple[int, ...] | None:
    """The keys (sorted) of the candidates whose removal lets `req` fit on the node; `()`
    when it fits without a drain; None when draining every candidate would not make room.

    `gpu_free` is the node's free milli per GPU slot (1000: a whole free GPU) and `present`
    which slots hold a GPU; `cpu_free` / `mem_free` the node's free CPU milli and MiB."""
    free = np.asarray(gpu_free).astype(np.int64)
    present = np.asarray(present, dtype=bool)
    reclaim = np.zeros_like(free)
    on_gpu: dict[int, list[RoomCandidate]] = {}
    for cand in candidates:
        for g in cand.slots:
            reclaim[g] += cand.milli
            on_gpu.setdefault(g, []).append(cand)
    chosen: dict[int, RoomCandidate] = {}
    if req.num_gpu == 0:
        pass
    elif req.fractional:
        room = present & (free + reclaim >= req.gpu_milli)
        if not room.any():
            return None
        if not (present & (free >= req.gpu_milli)).any():  # else only CPU or memory is short
            slot = int(np.flatnonzero(room)[np.argmin(reclaim[room])])
            got = int(free[slot])
            for cand in sorted(on_gpu.get(slot, []), key=lambda c: -c.gpus):
                if got >= req.gpu_milli:
                    break
                chosen[cand.key] = cand
                got += cand.milli
    else:
        full = present & (free + reclaim == MILLI)
        if int(full.sum()) < req.num_gpu:
            return None
        slots = np.flatnonzero(full)
        slots = slots[np.argsort(reclaim[slots], kind="stable")][: req.num_gpu]
        for slot in slots:
            chosen.update((c.key, c) for c in on_gpu.get(int(slot), []))
    cpu = int(cpu_free) + sum(c.cpu_milli for c in chosen.values())
    mem = int(mem_free) + sum(c.mem_mib for c in chosen.values())
    by_key = {c.key: c for c in candidates}
    # a set of the keys built in the candidates' order, less the chosen, then a stable sort:
    # ties keep that set's order (the simulator's figures depend on it, integer keys fix it)
    rest = set([c.key for c in candidates]) - set(chosen)
    for key in sorted(rest, key=lambda k: by_key[k].gpus):
        if cpu >= req.cpu_milli and mem >= req.mem_mib:
            break
        chosen[key] = by_key[key]
        cpu += by_key[key].cpu_milli
        mem += by_key[key].mem_mib
    if cpu < req.cpu_milli or mem < req.mem_mib:
        return None
    return tuple(sorted(chosen))
