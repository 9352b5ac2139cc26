from __future__ import annotations

import numpy as np
from simulate_testkit import inputs

from market_pipeline.lab.simulate.arrivals import candidates, initial_population, thin


def test_simulate_candidates_are_common_random_numbers():
    run = inputs()
    floor = run.floor_demand
    a = candidates(run.model, floor, 3600.0, 3600.0, seed=5, tick=1)
    b = candidates(run.model, floor, 3600.0, 3600.0, seed=5, tick=1)
    c = candidates(run.model, floor, 3600.0, 3600.0, seed=5, tick=2)
    np.testing.assert_array_equal(a.pod, b.pod)
    np.testing.assert_array_equal(a.time, b.time)
    assert a.size != c.size or not np.array_equal(a.pod, c.pod)
    assert np.all(np.diff(a.time) >= 0) and a.time.min() >= 3600.0 and a.time.max() < 7200.0


def test_simulate_thinning_keeps_the_demanded_share():
    run = inputs()
    floor = run.floor_demand * 50.0
    cands = candidates(run.model, floor, 0.0, 3600.0, seed=1, tick=0)
    kept_all, overflow = thin(cands, floor, floor)
    assert kept_all.size == cands.size and overflow == 0
    half, _ = thin(cands, floor * 0.5, floor)
    assert abs(half.size - cands.size / 2) < 4 * np.sqrt(cands.size / 4)
    _, overflow = thin(cands, floor * 1.5, floor)
    assert overflow > 0


def test_simulate_arrival_rate_follows_littles_law():
    run = inputs()
    demand = run.model.base_demand * 30.0
    cands = candidates(run.model, demand, 0.0, 24 * 3600.0, seed=2, tick=0)
    held = (run.pods.gpus[cands.pod] * run.pods.runtime_s[cands.pod]).sum() / (24 * 3600.0)
    assert 0.7 < held / demand.sum() < 1.3


def test_simulate_initial_population_holds_the_demand():
    run = inputs(pods=2000)
    demand = run.model.base_demand * 20.0
    init = initial_population(run.model, run.pods, demand, seed=4)
    held = run.pods.gpus[init.pod].sum()
    assert 0.75 < held / demand.sum() < 1.25
    assert np.all(init.remaining_s <= run.pods.runtime_s[init.pod] + 1e-9)
