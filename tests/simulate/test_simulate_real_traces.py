"""On the real traces (skipped without ../shared/data): the calibration contract holds."""

from __future__ import annotations

import numpy as np
import pytest
from simulate_testkit import config

from market_pipeline.lab.simulate.inputs import load_helios, load_nodes, load_pods
from market_pipeline.lab.simulate.runner import build_inputs
from market_pipeline.lab.simulate.settings import SimulationSettings
from market_pipeline.lab.simulate.tenants import best_response, list_price_vector


@pytest.fixture(scope="module")
def openb(shared_data):
    base = shared_data / "alibaba-gpu-2023"
    loads = sorted((shared_data / "helios-earth").glob("vc*.csv"))
    if not (base / "openb_pod_list_default.csv").is_file() or not loads:
        pytest.skip("openb or Helios traces missing")
    cfg = config()
    nodes = load_nodes(base / "openb_node_list_gpu_node.csv", cfg)
    pods = load_pods(base / "openb_pod_list_default.csv")
    load = load_helios(loads, 60)
    return cfg, nodes, pods, load


def test_simulate_openb_calibration_reproduces_the_helios_load(openb):
    cfg, nodes, pods, load = openb
    settings = SimulationSettings(days=1.0, load_start_day=14.0)
    run = build_inputs(cfg, settings, pods, nodes, load)
    assert nodes.size == 1213 and nodes.total_gpus == 6212
    expected = settings.load_target * nodes.total_gpus
    assert run.model.level_gpus == pytest.approx(expected)
    assert load.gap_steps == 24  # 10 May 2020 reads zero everywhere: a gap, not an idle day
    assert np.nanmean(load.factor()) == pytest.approx(1.0)
    demand = best_response(run.model, list_price_vector(run.pools))
    np.testing.assert_allclose(demand, run.model.base_demand, rtol=1e-7, atol=1e-9)
    assert demand.sum() == pytest.approx(expected, rel=1e-6)
    assert 0.05 < float(run.model.base_demand[run.model.elastic].sum() / demand.sum()) < 0.4
    t4 = next(p for p in run.pools if p.model == "T4")
    for cells in run.model.pods_by_cell:
        assert (pods.num_gpu[cells[t4.index]] <= t4.max_node_gpus).all()
    held = pods.gpus[run.initial.pod].sum()
    assert 0.6 < held / expected < 1.4
