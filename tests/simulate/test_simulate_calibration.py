from __future__ import annotations

import numpy as np
import pytest
from simulate_testkit import FLEET, config

from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.settings import EconomicAssumptions, pool_prices
from market_pipeline.lab.simulate.synthetic import synthetic_fleet, synthetic_pods
from market_pipeline.lab.simulate.tenants import best_response, build_pools, calibrate, list_price_vector


def _model(economics: EconomicAssumptions | None = None, pods: int = 500, level: float = 40.0):
    nodes = synthetic_fleet(FLEET)
    economics = economics or EconomicAssumptions(tenants_per_class=4)
    pools = build_pools(nodes, pool_prices(nodes.model_names(), config(), economics))
    table = synthetic_pods(pods, seed=3)
    return calibrate(table, nodes, pools, level, economics), pools, table


def test_simulate_calibration_reproduces_the_load_at_the_list_price():
    model, pools, _ = _model()
    demand = best_response(model, list_price_vector(pools))
    np.testing.assert_allclose(demand, model.base_demand, rtol=1e-7, atol=1e-9)
    assert model.base_demand.sum() == pytest.approx(40.0, rel=1e-9)


def test_simulate_calibration_gives_each_class_its_local_elasticity():
    model, pools, _ = _model()
    up = 1.01
    demand = best_response(model, list_price_vector(pools) * up)
    for j in range(model.size):
        mask = model.base_demand[j] > 0
        measured = -np.log(demand[j, mask] / model.base_demand[j, mask]) / np.log(up)
        np.testing.assert_allclose(measured, model.elasticity[j], rtol=0.02)
    assert model.elasticity[model.elastic].min() > model.elasticity[~model.elastic].max()


def test_simulate_calibration_sends_big_pods_only_where_they_fit():
    model, pools, table = _model()
    four_gpu_pool = [p.index for p in pools if p.max_node_gpus == 4][0]
    for cells in model.pods_by_cell:
        assert (table.num_gpu[cells[four_gpu_pool]] <= 4).all()
    assert any((table.num_gpu[cells[1 - four_gpu_pool]] == 8).any() for cells in model.pods_by_cell)


def test_simulate_calibration_rejects_a_qos_in_no_class():
    with pytest.raises(SimulationInputError, match="neither elastic nor rigid"):
        _model(EconomicAssumptions(elastic_qos=("BE",), rigid_qos=("LS",), tenants_per_class=2))


def test_simulate_economics_reject_overlapping_classes():
    with pytest.raises(SimulationInputError, match="both elastic and rigid"):
        EconomicAssumptions(elastic_qos=("BE", "LS"))


def test_simulate_pool_prices_follow_the_config_and_the_cap():
    cfg = config()
    prices = {p.model: p for p in pool_prices(("A10", "G2"), cfg, EconomicAssumptions(guaranteed_cap=1.1))}
    a10 = next(p for p in cfg.pools if p.gpu_model == "A10")
    assert prices["A10"].list_price == a10.base_price
    assert prices["A10"].guaranteed_max == pytest.approx(1.1 * a10.base_price)
    assert prices["G2"].unit_cost == pytest.approx(0.5 * prices["G2"].list_price)
