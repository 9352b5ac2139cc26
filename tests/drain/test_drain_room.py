"""The shared room search (`drain.room.room_victims`) picks exactly what the simulator's own
search picked before it moved there: the simulator's benchmark figures depend on it."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from market_pipeline.drain.room import RoomCandidate, room_victims
from market_pipeline.lab.simulate.drains import _victims_on_node
from market_pipeline.placement.capacity import MILLI, Placement, PodRequest


def reference_victims(jobs, cluster, row, running, req):
    """`lab/simulate/drains.py::_victims_on_node` as it was before `drain.room` (a920930)."""
    cap = cluster.cap
    free = cap.gpu_free[row].astype(np.int64)
    present = cap.present[row]
    reclaim = np.zeros_like(free)
    on_gpu: dict[int, list[int]] = {}
    for job in running:
        placement = jobs.placement[job]
        assert placement is not None
        for g in placement.gpus:
            reclaim[g] += placement.milli
            on_gpu.setdefault(g, []).append(job)
    chosen: set[int] = set()
    if req.num_gpu == 0:
        pass
    elif req.fractional:
        room = present & (free + reclaim >= req.gpu_milli)
        if not room.any():
            return None
        if (present & (free >= req.gpu_milli)).any():
            pass  # GPU room exists; only CPU or memory can be short
        else:
            slot = int(np.flatnonzero(room)[np.argmin(reclaim[room])])
            got = int(free[slot])
            for job in sorted(on_gpu.get(slot, []), key=lambda j: -jobs.gpus[j]):
                if got >= req.gpu_milli:
                    break
                chosen.add(job)
                got += jobs.placement[job].milli
    else:
        full = present & (free + reclaim == MILLI)
        if int(full.sum()) < req.num_gpu:
            return None
        slots = np.flatnonzero(full)
        slots = slots[np.argsort(reclaim[slots], kind="stable")][: req.num_gpu]
        for slot in slots:
            chosen.update(on_gpu.get(int(slot), []))

    def cpu_of(j):
        return cluster.requests[jobs.pod[j]].cpu_milli

    def mem_of(j):
        return cluster.requests[jobs.pod[j]].mem_mib

    cpu = int(cap.cpu_free[row]) + sum(cpu_of(j) for j in chosen)
    mem = int(cap.mem_free[row]) + sum(mem_of(j) for j in chosen)
    for job in sorted(set(running) - chosen, key=lambda j: jobs.gpus[j]):
        if cpu >= req.cpu_milli and mem >= req.mem_mib:
            break
        chosen.add(job)
        cpu += cpu_of(job)
        mem += mem_of(job)
    if cpu < req.cpu_milli or mem < req.mem_mib or not chosen:
        return None
    return tuple(sorted(chosen))


def random_node(rng: random.Random):
    """One node (row 1 of two) with jobs placed on it; a random subset is drainable."""
    slots = rng.choice([1, 2, 4, 8])
    width = 8
    present = np.zeros((2, width), dtype=bool)
    present[1, :slots] = True
    free = np.where(present, MILLI, 0).astype(np.int32)
    placements: dict[int, Placement] = {}
    gpus: dict[int, float] = {}
    pods: dict[int, int] = {}
    requests = []
    ids = rng.sample(range(5000), 16)  # large, unordered job rows: the tie order must hold too
    for job in ids[: rng.randint(0, 12)]:
        if rng.random() < 0.4:
            n = rng.choice([1, 1, 2, 4])
            whole = [g for g in range(slots) if free[1, g] == MILLI]
            if len(whole) < n:
                continue
            taken = tuple(sorted(rng.sample(whole, n)))
            placements[job] = Placement(1, taken, MILLI)
            gpus[job] = float(n)
        else:
            milli = rng.choice([100, 143, 250, 286, 300, 500, 571, 700])
            fits = [g for g in range(slots) if free[1, g] >= milli]
            if not fits:
                continue
            slot = rng.choice(fits)
            placements[job] = Placement(1, (slot,), milli)
            # a MIG instance reserves its slices' share, the job counts its request
            gpus[job] = rng.choice([milli / MILLI, round(rng.choice([0.1, 0.25, 0.5]), 2)])
        for g in placements[job].gpus:
            free[1, g] -= placements[job].milli
        pods[job] = len(requests)
        requests.append(
            SimpleNamespace(cpu_milli=rng.choice([0, 500, 2000, 8000]), mem_mib=rng.choice([0, 1024, 65536]))
        )
    running = [j for j in placements if rng.random() < 0.7]
    rng.shuffle(running)
    cap = SimpleNamespace(
        gpu_free=free,
        present=present,
        cpu_free=np.array([0, rng.choice([0, 1000, 4000, 64000])], dtype=np.int64),
        mem_free=np.array([0, rng.choice([0, 2048, 262144])], dtype=np.int64),
    )
    jobs = SimpleNamespace(placement=placements, gpus=gpus, pod=pods)
    return jobs, SimpleNamespace(cap=cap, requests=requests), running


def random_request(rng: random.Random) -> PodRequest:
    num = rng.choice([0, 1, 1, 1, 2, 4, 8])
    milli = rng.choice([100, 250, 500, 700, MILLI]) if num == 1 else MILLI
    return PodRequest(num, milli, rng.choice([0, 0, 1000, 16000]), rng.choice([0, 0, 4096, 131072]))


@pytest.mark.parametrize("seed", range(8))
def test_room_search_matches_the_simulators_former_search(seed: int) -> None:
    rng = random.Random(seed)
    seen = {"drain": 0, "none": 0}
    for _ in range(600):
        jobs, cluster, running = random_node(rng)
        req = random_request(rng)
        expected = reference_victims(jobs, cluster, 1, running, req)
        assert _victims_on_node(jobs, cluster, 1, running, req) == expected, (req, running)
        seen["drain" if expected else "none"] += 1
    assert seen["drain"] > 50 and seen["none"] > 50  # both answers were exercised


def test_room_that_fits_already_needs_no_victims() -> None:
    free = np.array([MILLI, 0])
    present = np.array([True, True])
    blocker = RoomCandidate(key=3, slots=(1,), milli=MILLI, gpus=1.0)
    assert room_victims(free, present, 0, 0, [blocker], PodRequest(1, MILLI)) == ()
    assert room_victims(free, present, 0, 0, [blocker], PodRequest(2, MILLI)) == (3,)
    assert room_victims(free, present, 0, 0, [blocker], PodRequest(4, MILLI)) is None
