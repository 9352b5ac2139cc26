"""The room kept for forecast guaranteed arrivals (`placement.guarantee.reserved_nodes`,
`GuaranteedForecast`): counted in nodes where a guaranteed shape's GPU share, cores and memory
fit together, not in free GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.placement.capacity import ClusterCapacity, PodRequest
from market_pipeline.placement.guarantee import (
    GuaranteedForecast,
    choose_outside,
    kept_empty,
    largest_nodes,
    refilling_nodes,
    reserved_nodes,
)
from market_pipeline.placement.policies import BestFit

CORES = 64_000


def _fragmented() -> ClusterCapacity:
    """Three 8-GPU, 64-core nodes: node 0 has a half GPU free on every GPU but under a core;
    node 1 has 63 cores but no GPU share; node 2 has four whole GPUs and 63.6 cores."""
    cap = ClusterCapacity.build([f"n{i}" for i in range(3)], ["G2"] * 3, [8] * 3, [CORES] * 3, [256_000] * 3)
    for node, jobs, req in (
        (0, 8, PodRequest(1, 500, 7_900, 1_000)),
        (1, 8, PodRequest(1, 1000, 100, 1_000)),
        (2, 4, PodRequest(1, 1000, 100, 1_000)),
    ):
        cap.schedulable[:] = np.arange(3) == node
        for _ in range(jobs):
            cap.allocate(req, BestFit().choose(cap, req))
    cap.schedulable[:] = True
    return cap


def test_the_reserve_is_the_node_where_a_guaranteed_shape_fits_whole_not_where_gpus_are_free():
    cap = _fragmented()
    rigid = PodRequest(1, 500, 12_000, 46_000)  # half a GPU, 12 cores, 46 GiB
    assert cap.free_gpus(np.arange(3)) == 8.0  # 4 GPUs free on node 0 in halves, 4 whole on node 2
    assert reserved_nodes(cap, [rigid]).tolist() == [False, False, True]
    # two expected jobs pack onto the same node: the reserve does not take a node per job
    assert reserved_nodes(cap, [rigid, rigid]).tolist() == [False, False, True]
    # node 2's cores take five; the sixth fits nowhere and keeps the node nearest to fitting it
    # (node 0 lacks 11.2 of 12 cores, node 1 the whole GPU share), which frees as its jobs end
    assert reserved_nodes(cap, [rigid] * 6).tolist() == [True, False, True]
    # nodes kept from drainable work already are not counted again
    assert reserved_nodes(cap, [rigid], off=np.array([False, False, True])).tolist() == [True, False, False]
    assert not reserved_nodes(cap, []).any()
    # a drainable job that fits only the reserved node waits; without the reserve it takes it
    small = PodRequest(1, 500, 1_000, 1_000)
    assert BestFit().choose(cap, small).node == 2
    assert choose_outside(BestFit(), cap, small, reserved_nodes(cap, [rigid])) is None
    before = (cap.gpu_free.copy(), cap.cpu_free.copy(), cap.mem_free.copy())
    reserved_nodes(cap, [rigid] * 6)
    assert all((a == b).all() for a, b in zip(before, (cap.gpu_free, cap.cpu_free, cap.mem_free)))


def test_a_whole_node_guaranteed_shape_reserves_an_empty_node_and_respects_its_gpu_model():
    cap = ClusterCapacity.build(["a", "b", "c"], ["G2", "G2", "T4"], [8, 8, 8], [CORES] * 3, [256_000] * 3)
    one = PodRequest(1, 1000, 1_000, 1_000)
    cap.allocate(one, BestFit().choose(cap, one))  # best fit: node a now has 7 free
    whole = PodRequest(8, 1000, 8_000, 8_000, ("G2",))
    assert reserved_nodes(cap, [whole]).tolist() == [False, True, False]
    assert reserved_nodes(cap, [whole, whole]).tolist() == [True, True, False]  # a: nearest to fitting
    assert not reserved_nodes(cap, [PodRequest(8, 1000, 8_000, 8_000, ("A100",))]).any()  # no such node


def test_the_forecast_expects_the_recent_rate_in_the_latest_arrivals_shapes():
    forecast = GuaranteedForecast(window_s=3600.0)
    half = PodRequest(1, 500, 12_000, 46_000)
    for k in range(7):  # seven half-GPU arrivals in the hour
        forecast.record(100.0 * k, PodRequest(1, 500, 12_000 + k, 46_000))
    forecast.record(650.0, PodRequest(8, 1000, 64_000, 0))  # and one whole-node arrival
    # 8 arrivals x 600/3600 = 1.33: two expected, the latest two, largest first
    assert [(r.num_gpu, r.cpu_milli) for r in forecast.expected(1_000.0, 600.0)] == [(8, 64_000), (1, 12_006)]
    assert [r.num_gpu for r in forecast.expected(1_000.0, 3_600.0)] == [8] + [1] * 7  # all of them
    assert forecast.expected(1_000.0, 0.0) == []
    # arrivals older than the window no longer count: at 3,750 s six remain, one expected
    assert forecast.expected(3_750.0, 600.0) == [PodRequest(8, 1000, 64_000, 0)]
    assert len(forecast.records) == 6
    assert forecast.expected(10_000.0, 600.0) == [] and not forecast.records
    bounded = GuaranteedForecast(window_s=3600.0, max_records=3)
    for k in range(5):
        bounded.record(float(k), half)
    assert len(bounded.records) == 3
    with pytest.raises(ValueError):
        GuaranteedForecast(window_s=0.0)


def test_a_longer_window_keeps_as_many_arrivals_an_hour_as_an_hour_long_one():
    """A busy pool's 5,000 arrivals over four hours: a four-hour window keeps them all (4,096 a
    started hour of window), and expects 5,000 x 600/14,400 = 209 within an SLA wait; kept to
    one hour's 4,096 records, the rate would read 171."""
    forecast = GuaranteedForecast(window_s=4 * 3600.0)
    for k in range(5_000):
        forecast.record(k * 2.88, PodRequest(1, 1000, 1_000, 1_000))
    assert forecast.records.maxlen == 4 * 4096 and len(forecast.records) == 5_000
    assert len(forecast.expected(5_000 * 2.88, 600.0)) == 209
    assert GuaranteedForecast(window_s=90 * 60.0).records.maxlen == 2 * 4096


@pytest.mark.parametrize(("largest", "kept"), [(20, 2), (17, 1), (10, 1), (9, 0)])
def test_a_model_keeps_at_most_one_empty_node_per_ten_of_its_largest(largest, kept):
    """`empty_nodes_kept` = 2: a model with 20 largest nodes keeps its last two empty ones; one
    with 10-19 (openb's T4 has 17) keeps one, not none; one with 9 keeps none."""
    cap = _nodes(("G2", largest, 8), ("G2", 3, 4))
    _fill(cap, range(largest - 3))  # three largest nodes empty, and the three 4-GPU ones
    assert not kept_empty(cap, 2).any()  # three empty: drainable work may take one
    _fill(cap, [largest - 3])  # two left
    # both kept where the model keeps two; where it keeps one, two empty leave one to take
    assert np.flatnonzero(kept_empty(cap, 2)).tolist() == ([largest - 2, largest - 1] if kept == 2 else [])
    _fill(cap, [largest - 2])  # one left: kept wherever the model keeps any
    assert np.flatnonzero(kept_empty(cap, 2)).tolist() == ([largest - 1] if kept else [])
    assert np.flatnonzero(kept_empty(cap, 1)).tolist() == ([largest - 1] if kept else [])


def _nodes(*groups: tuple[str, int, int]) -> ClusterCapacity:
    """(model, count, GPUs per node) groups of nodes, in that order."""
    models = [m for m, n, _ in groups for _ in range(n)]
    gpus = [g for _, n, g in groups for _ in range(n)]
    n = len(models)
    return ClusterCapacity.build([f"n{i}" for i in range(n)], models, gpus, [CORES] * n, [256_000] * n)


def _fill(cap: ClusterCapacity, rows) -> None:
    one = PodRequest(1, 1000, 100, 1_000)
    schedulable = cap.schedulable.copy()
    for row in rows:
        cap.schedulable[:] = np.arange(cap.n_nodes) == row
        cap.allocate(one, BestFit().choose(cap, one))
    cap.schedulable[:] = schedulable


def test_the_last_empty_largest_node_of_a_model_is_kept_from_drainable_work():
    # G2: ten 8-GPU nodes and two 4-GPU ones (not its largest); T4: nine 8-GPU nodes
    cap = _nodes(("G2", 10, 8), ("G2", 2, 4), ("T4", 9, 8))
    assert largest_nodes(cap)[:12].tolist() == [True] * 10 + [False] * 2
    _fill(cap, range(8))  # one GPU used on G2 nodes 0-7: nodes 8 and 9 empty
    assert not kept_empty(cap, 1).any()  # two empty: drainable work may take one
    _fill(cap, [8])
    kept = kept_empty(cap, 1)
    assert np.flatnonzero(kept).tolist() == [9]  # the last empty 8-GPU G2 node, not the 4-GPU ones
    assert choose_outside(BestFit(), cap, PodRequest(1, 1000, 100, 1_000), kept).node != 9
    assert not kept_empty(cap, 0).any()  # 0 turns it off
    # keeping 2 needs 20 largest G2 nodes: with ten, G2 keeps one, as with 1
    assert np.flatnonzero(kept_empty(cap, 2)).tolist() == [9]
    _fill(cap, range(12, 20))  # T4: nine largest nodes, under ten: one empty left, not kept
    assert not kept[12:].any() and not kept_empty(cap, 1)[12:].any()
    cap.schedulable[9] = False  # a cordoned node is not capacity: nothing left to keep
    assert not kept_empty(cap, 1).any()


def test_the_kept_empty_nodes_are_refilled_from_the_largest_nodes_without_guaranteed_work_nearest_to_empty():
    """A model with 20 largest nodes keeps two empty (`kept_empty`). With one empty, one more
    node refills the stock: the largest node that is not empty, runs no guaranteed work and has
    the most free GPU room (ties to the lower row); none empty, two. Not a node running
    guaranteed work, a cordoned one or a smaller one; nothing while the keep is empty, with
    `keep` 0 or in a model too small to keep any."""
    cap = _nodes(("G2", 20, 8), ("G2", 2, 4), ("T4", 9, 8))
    assert not refilling_nodes(cap, 2, np.zeros(cap.n_nodes, dtype=bool)).any()  # all empty
    for row in range(19):
        for _ in range(7 if row not in (3, 5, 7, 8) else 2):  # 3, 5, 7, 8 nearest to empty
            _fill(cap, [row])
    _fill(cap, range(20, 31))  # the 4-GPU G2 nodes and T4 (too small to keep any) in use
    guaranteed = np.zeros(cap.n_nodes, dtype=bool)
    guaranteed[3] = True  # the nearest to empty, but its guaranteed job does not drain
    assert np.flatnonzero(refilling_nodes(cap, 2, guaranteed)).tolist() == [5]  # node 19 is empty
    _fill(cap, [19] * 7)  # none empty: two refill
    assert np.flatnonzero(refilling_nodes(cap, 2, guaranteed)).tolist() == [5, 7]
    cap.schedulable[5] = False  # cordoned: not capacity
    assert np.flatnonzero(refilling_nodes(cap, 2, guaranteed)).tolist() == [7, 8]
    assert np.flatnonzero(refilling_nodes(cap, 1, guaranteed)).tolist() == [7]
    assert not refilling_nodes(cap, 0, guaranteed).any()
    cap.schedulable[5] = True
    guaranteed[5] = True
    assert np.flatnonzero(refilling_nodes(cap, 2, guaranteed)).tolist() == [7, 8]
