"""The shared room search (`drain.room.room_victims`) picks exactly what the simulator's own
search picked before it moved there: the simulator's benchmark figures depend on it.

The former search's answers on the drawn cases are recorded, not its code copied here:
`tests/fixtures/drain_room_parity.json` holds what `lab/simulate/drains.py::_victims_on_node`
at a920930 returned for each case `random_node`/`random_request` draw (seeds 0-7, 600 each).
A change to the draws needs the file made again from that commit's function."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from market_pipeline.drain.room import RoomCandidate, room_victims
from market_pipeline.lab.simulate.drains import _victims_on_node
from market_pipeline.placement.capacity import MILLI, Placement, PodRequest


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


RECORDED = Path(__file__).parents[1] / "fixtures" / "drain_room_parity.json"


@pytest.mark.parametrize("seed", range(8))
def test_room_search_matches_the_simulators_former_search(seed: int) -> None:
    answers = json.loads(RECORDED.read_text())["answers"][str(seed)]
    rng = random.Random(seed)
    for expected in answers:
        jobs, cluster, running = random_node(rng)
        req = random_request(rng)
        found = _victims_on_node(jobs, cluster, 1, running, req)
        assert found == (None if expected is None else tuple(expected)), (req, running)
    assert 50 < sum(a is not None for a in answers) < len(answers) - 50  # both answers exercised


def test_room_that_fits_already_needs_no_victims() -> None:
    free = np.array([MILLI, 0])
    present = np.array([True, True])
    blocker = RoomCandidate(key=3, slots=(1,), milli=MILLI, gpus=1.0)
    assert room_victims(free, present, 0, 0, [blocker], PodRequest(1, MILLI)) == ()
    assert room_victims(free, present, 0, 0, [blocker], PodRequest(2, MILLI)) == (3,)
    assert room_victims(free, present, 0, 0, [blocker], PodRequest(4, MILLI)) is None
