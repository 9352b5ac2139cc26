"""Instance JSON: what is accepted, clear errors naming the field, forecast scaling."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from market_test_helpers import assert_close, resource, tenant

from market_pipeline.market.errors import InstanceError
from market_pipeline.market.followers import solve_followers
from market_pipeline.market.problem import MarketProblem

BASE = {
    "resources": [
        resource("h100/us-east/guaranteed", 10.0, 2.0, 0.5, 20.0, gpu_model="H100", zone="us-east"),
        resource(
            "h100/us-east/drainable",
            5.0,
            1.8,
            0.2,
            20.0,
            gpu_model="H100",
            zone="us-east",
            **{"class": "drainable", "discount_band": [0.2, 0.6]},
        ),
        resource("a100/eu/guaranteed", None, 1.2, 0.3, 9.0),
    ],
    "tenants": [
        tenant("a", [4.0, 3.0, 2.0], [1.0, 1.0, 1.0], 5.0),
        tenant("b", {"a100/eu/guaranteed": 6.0}, 2.0, None, "quadratic", delay_cost=0.1),
        tenant(7, [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], 3.0, "isoelastic", eta=0.5, multiplicity=4),
        tenant("r", [5.0, 5.0, 0.0], [1.0, 1.0, 1.0], 2.0, **{"class": "rigid"}),
    ],
}


def test_valid_instance_round_trips():
    problem = MarketProblem.from_instance_json(BASE)
    res, pop = problem.resources, problem.tenants
    assert res.names[1] == "h100/us-east/drainable" and res.pool[0] == res.pool[1] == "H100/us-east"
    assert len(res.band_pairs) == 1 and res.band_pairs[0].discount_max == 0.6
    assert np.isinf(res.capacity[2])
    assert set(pop.ids) == {"a", "b", "7", "r"} and pop.families.count("isoelastic") == 1
    rigid = pop.ids.index("r")
    assert float(pop.weight[rigid, 1]) == 0.0  # a rigid tenant cannot buy the drainable class
    again = MarketProblem.from_instance_json(problem.to_instance_json())
    assert_close(again.tenants.weight, pop.weight)
    assert_close(again.tenants.budget, pop.budget)
    assert again.resources.names == res.names


def _broken(path, value):
    data = copy.deepcopy(BASE)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path,value,message",
    [
        (("tenants", 0, "budget"), KeyError, r"tenants\[0\].*missing field.*budget"),
        (("tenants", 0, "utility"), "cobb-douglas", r"tenants\[0\].*utility"),
        (("tenants", 0, "weight"), [1.0, -1.0, 0.0], r"tenants\.weight.*'a'"),
        (("tenants", 0, "weight"), [1.0, 2.0], r"tenants\[0\].*weight.*3 values"),
        (("tenants", 0, "saturation"), [1.0, 0.0, 1.0], r"tenants\.saturation"),
        (("tenants", 0, "weights"), [1.0, 1.0, 1.0], r"unknown field.*weights"),
        (("tenants", 2, "eta"), KeyError, r"eta.*isoelastic"),
        (("tenants", 3, "drain_tolerant"), True, r"rigid.*drain tolerant"),
        (("tenants", 1, "id"), "a", r"duplicate id 'a'"),
        (("tenants", 1, "weight"), {"h200": 1.0}, r"unknown resource name.*h200"),
        (("tenants", 0, "budget"), 0.0, r"tenants\.budget"),
        (("resources", 0, "price_min"), 0.0, r"resources\.price_min"),
        (("resources", 0, "price_max"), 0.1, r"resources\.price_max"),
        (("resources", 0, "capacity"), "lots", r"resources\[0\]\.capacity"),
        (("resources", 2, "class"), "spot", r"resources\[2\]\.class"),
        (("resources", 2, "discount_band"), [0.1, 0.2], r"only drainable"),
        (("resources", 1, "discount_band"), [0.5, 0.2], r"discount_band"),
        (("resources", 1, "name"), "h100/us-east/guaranteed", r"names must be unique"),
    ],
)
def test_invalid_instance_names_the_field(path, value, message):
    with pytest.raises(InstanceError, match=message):
        MarketProblem.from_instance_json(_broken(path, value))


def test_non_object_instance_is_rejected():
    with pytest.raises(InstanceError, match="instance"):
        MarketProblem.from_instance_json([1, 2, 3])


def test_uniform_demand_scale_multiplies_the_best_response_exactly():
    problem = MarketProblem.from_instance_json(BASE)
    scaled = problem.with_demand_scale(1.7)
    p = torch.tensor([1.0, 0.8, 0.6], dtype=torch.float64)
    before = solve_followers(problem.tenants.on("cpu"), p, tol=1e-14)
    after = solve_followers(scaled.tenants.on("cpu"), p, tol=1e-14)
    assert bool(before.budget_bound.any())  # the budget multiplier is exercised too
    assert_close(after.demand, 1.7 * before.demand, rtol=1e-9, atol=1e-12)
    assert_close(after.scale, before.scale, rtol=1e-9, atol=1e-12)


def test_per_resource_demand_scale_for_unconstrained_tenants():
    data = copy.deepcopy(BASE)
    for item in data["tenants"]:
        item["budget"] = None
    problem = MarketProblem.from_instance_json(data)
    scaled = problem.with_demand_scale({"h100/us-east/guaranteed": 2.0})
    p = torch.tensor([3.0, 2.0, 1.5], dtype=torch.float64)
    before = solve_followers(problem.tenants.on("cpu"), p).demand
    after = solve_followers(scaled.tenants.on("cpu"), p).demand
    assert_close(after[:, 0], 2.0 * before[:, 0])
    assert_close(after[:, 1:], before[:, 1:])
    with pytest.raises(InstanceError, match="unknown resource"):
        problem.with_demand_scale({"nope": 1.0})
    with pytest.raises(InstanceError, match="demand scale"):
        problem.with_demand_scale(-1.0)
