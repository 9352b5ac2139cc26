"""The simulator's incremental best-fit picks exactly what the live BestFit policy picks."""

from __future__ import annotations

import numpy as np
import pytest
from simulate_testkit import config

from market_pipeline.lab.simulate.cluster import IncrementalBestFit, PoolCluster
from market_pipeline.lab.simulate.settings import EconomicAssumptions, pool_prices
from market_pipeline.lab.simulate.synthetic import synthetic_fleet
from market_pipeline.lab.simulate.tenants import build_pools
from market_pipeline.placement.capacity import PodRequest
from market_pipeline.placement.policies import BestFit

SHAPES = [(1, 1000), (1, 500), (1, 250), (1, 700), (2, 1000), (4, 1000), (8, 1000), (3, 1000)]


def _cluster(policy: str, model: str = "G2") -> PoolCluster:
    fleet = synthetic_fleet({model: (12, 8)}, cpu_per_gpu=8000)
    pools = build_pools(fleet, pool_prices(fleet.model_names(), config(), EconomicAssumptions()))
    return PoolCluster(pools[0], fleet, policy, None, [])


@pytest.mark.parametrize("seed,model", [(0, "G2"), (1, "V100M16"), (2, "G3")])  # NVLink domains 1, 4, 8
def test_incremental_best_fit_matches_the_live_policy(seed, model):
    rng = np.random.default_rng(seed)
    cluster = _cluster("best_fit", model)
    assert isinstance(cluster.fast, IncrementalBestFit)
    live = BestFit()
    running: list[tuple[PodRequest, object]] = []
    placed = refused = 0
    for _ in range(1500):
        if running and rng.random() < 0.45:
            req, placement = running.pop(int(rng.integers(len(running))))
            cluster.release(req, placement)
            continue
        n, milli = SHAPES[int(rng.integers(len(SHAPES)))]
        req = PodRequest(n, milli, int(rng.integers(1, 6)) * 4000 * n, int(rng.integers(1, 4)) * 16000 * n)
        expected = live.choose(cluster.cap, req)
        got = cluster.place(req)
        assert got == expected
        if got is None:
            refused += 1
        else:
            placed += 1
            running.append((req, got))
    assert placed > 300 and refused > 10  # both paths exercised, including a full cluster


def test_counters_follow_the_capacity_after_every_change():
    cluster = _cluster("best_fit")
    req = PodRequest(1, 300, 1000, 1000)
    placements = [cluster.place(req) for _ in range(5)]
    cluster.release(req, placements[2])
    np.testing.assert_array_equal(cluster.node_free, cluster.cap.gpu_free.sum(axis=1))
    np.testing.assert_array_equal(cluster.node_best, cluster.cap.gpu_free.max(axis=1))
    np.testing.assert_array_equal(cluster.node_full, (cluster.cap.gpu_free == 1000).sum(axis=1))


def test_other_policies_use_the_live_policy():
    assert _cluster("round_robin").fast is None
