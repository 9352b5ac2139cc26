"""The leader's global phase on budget-coupled markets, checked against brute force.

Instances: ``coupled_problem`` (log tenants over 2-3 resources, budgets about 40% of what they
would spend at the uncoupled monopoly prices, loose or tight capacity). The known optimum is
found by brute force: a fine log grid over the whole price box, refined around its best
cells, priced with the reference's exact numpy follower response (``ExactDemand``, closed form
for log tenants; itself checked against the tests' bisection, ``grid_demand``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from market_test_helpers import grid_demand

from market_pipeline.cli import main
from market_pipeline.lab.market.generate import coupled_problem, random_problem
from market_pipeline.lab.market.reference import ExactDemand, reference_optimum
from market_pipeline.market.batch_eval import stacked_demand
from market_pipeline.market.errors import InstanceError
from market_pipeline.market.report import SolverSettings
from market_pipeline.market.resolve import global_resolve, relative_gain, step_toward, worth_switching
from market_pipeline.market.solve import demand_at, solve_equilibrium
from market_pipeline.market.workspace import Workspace

TARGET = 1e-3  # the engine within 0.1% of the known optimum


def grid_profit(problem, prices: np.ndarray) -> np.ndarray:
    """Profit at each row of ``prices``; -inf where capacity would be oversold."""
    res = problem.resources
    demand = np.vstack(
        [ExactDemand(problem)(chunk) for chunk in np.array_split(prices, max(1, len(prices) // 4096))]
    )
    profit = ((prices - res.unit_cost) * demand).sum(axis=1)
    return np.where(np.all(demand <= res.capacity * (1 + 1e-9), axis=1), profit, -np.inf)


def test_exact_demand_matches_bisection():
    problem = coupled_problem(40, 3, 2, tight=True)
    res = problem.resources
    prices = res.price_min * (res.price_max / res.price_min) ** np.random.default_rng(0).random((20, 3))
    np.testing.assert_allclose(
        ExactDemand(problem)(prices), grid_demand(problem, prices), rtol=1e-9, atol=1e-9
    )


def brute_force(problem, points: int, rounds: int = 3, keep: int = 6) -> tuple[float, np.ndarray]:
    """Best feasible profit over a log grid of the price box, then ``rounds`` of local grids
    (7 points a side, one cell wide) around the ``keep`` best points so far."""
    res = problem.resources
    low, high = np.log(res.price_min), np.log(res.price_max)
    axes = [np.linspace(lo, hi, points) for lo, hi in zip(low, high)]
    grid = np.exp(np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, res.size))
    profit = grid_profit(problem, grid)
    cell = (high - low) / (points - 1)
    for _ in range(rounds):
        best = grid[np.argsort(profit)[-keep:]]
        side = [np.linspace(-1, 1, 7)] * res.size
        offsets = np.stack(np.meshgrid(*side, indexing="ij"), axis=-1).reshape(-1, res.size)
        local = np.exp(np.log(best)[:, None, :] + offsets[None] * cell).reshape(-1, res.size)
        local = np.clip(local, res.price_min, res.price_max)
        grid, profit = np.vstack([grid, local]), np.concatenate([profit, grid_profit(problem, local)])
        cell = cell / 3
    i = int(np.argmax(profit))
    return float(profit[i]), grid[i]


@pytest.mark.parametrize(
    "tenants, resources, seed, tight, points",
    [
        (24, 2, 0, False, 120),  # the local solve alone stops 0.9% short
        (40, 2, 5, True, 120),  # tight capacity: three optima
        (30, 3, 4, False, 28),
        (30, 3, 7, True, 28),
    ],
)
def test_engine_matches_the_brute_force_optimum(tenants, resources, seed, tight, points):
    problem = coupled_problem(tenants, resources, seed, tight=tight)
    report = solve_equilibrium(problem)
    known, _ = brute_force(problem, points)
    assert report.status == "converged"
    assert report.profit >= known * (1 - TARGET)
    # the engine's prices, judged by the independent follower response: feasible, same profit
    independent = grid_profit(problem, report.prices[None])[0]
    assert np.isfinite(independent) and independent == pytest.approx(report.profit, rel=1e-6)
    if tight:
        assert np.any(report.demand >= problem.resources.capacity * (1 - 1e-6))  # capacity binds


def test_budgets_bind_and_the_local_solve_alone_misses():
    """The instance of the first case is what the global phase is for."""
    problem = coupled_problem(24, 2, 0)
    local = solve_equilibrium(problem, settings=SolverSettings(global_phase=False))
    best = solve_equilibrium(problem)
    assert local.status == best.status == "converged"
    assert local.budget_bound_tenants >= 0.6 * problem.tenants.size
    assert best.profit > local.profit * (1 + 5e-3)
    assert local.starts == 1 and local.screened_prices == 0


def test_report_says_how_sure_it_is():
    problem = coupled_problem(40, 2, 5, tight=True)
    report = solve_equilibrium(problem)
    assert report.starts >= 2 and report.distinct_optima >= 2
    assert report.screened_prices > 0 and 0 < report.alternative_gap < 0.1
    body = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert body["starts"] == report.starts and body["distinct_optima"] == report.distinct_optima
    assert body["alternative_gap"] == pytest.approx(report.alternative_gap)
    for key in ("prices", "profit", "kkt_residual", "iterations", "status", "nonsmooth"):  # unchanged keys
        assert key in body
    warm = solve_equilibrium(problem, last_prices=report.prices, max_step=0.1)
    assert (warm.starts, warm.distinct_optima, warm.screened_prices, warm.alternative_gap) == (1, 1, 0, None)


def test_bench_instance_keeps_its_optimum():
    """The bench's separable-ish instance: the global phase screens and keeps the local optimum."""
    problem = random_problem(200, 8, 0)
    with_phase = solve_equilibrium(problem)
    without = solve_equilibrium(problem, settings=SolverSettings(global_phase=False))
    assert with_phase.screened_prices > 0
    assert with_phase.profit >= without.profit * (1 - 1e-9)


def test_stacked_demand_matches_one_solve_per_price_vector():
    problem = random_problem(60, 6, 3)  # all three families, delay costs
    pop = problem.tenants.on("cpu")
    res = problem.resources
    rng = np.random.default_rng(1)
    prices = res.price_min * (res.price_max / res.price_min) ** rng.random((4, res.size))
    rows = torch.arange(pop.size).repeat(4)
    which = torch.arange(4).repeat_interleave(pop.size)
    with torch.inference_mode():
        workspace = Workspace(res.size, pop.device)
        demand, _ = stacked_demand(pop, rows, torch.as_tensor(prices)[which], workspace, tol=1e-12)
        totals = torch.zeros((4, res.size), dtype=torch.float64).index_add_(0, which, demand).numpy()
    for k in range(4):
        np.testing.assert_allclose(totals[k], demand_at(problem, prices[k]), rtol=1e-8, atol=1e-10)


def test_reference_agrees_with_brute_force():
    problem = coupled_problem(24, 2, 0)
    ref = reference_optimum(problem, starts=12, seed=0)
    known, _ = brute_force(problem, 120)
    assert ref.profit == pytest.approx(known, rel=TARGET)


def test_bench_global_json(capsys):
    assert main(["bench", "global", "--tenants", "20", "--resources", "2", "--starts", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["instances"][0]
    assert row["reference_starts"] == 3 and row["starts"] >= 1 and "gap" in row and "all_within_target" in out
    assert main(["bench", "global", "--starts", "0", "--json"]) == 2


# -- the live loop's re-solve and walk ---------------------------------------------------------


def test_global_resolve_is_never_worse_than_the_local_optimum_in_force():
    problem = coupled_problem(24, 2, 0)
    local = solve_equilibrium(problem, settings=SolverSettings(global_phase=False))
    fresh = global_resolve(problem, SolverSettings(global_phase=False), current_prices=local.prices)
    assert fresh.status == "converged" and fresh.starts >= 2
    assert fresh.profit >= local.profit * (1 - 1e-9)
    assert worth_switching(relative_gain(fresh.profit, local.profit), 1e-3)
    with pytest.raises(InstanceError, match="current_prices"):
        global_resolve(problem, current_prices=np.ones(3))
    with pytest.raises(InstanceError, match="extra_starts"):
        solve_equilibrium(problem, last_prices=local.prices, extra_starts=[local.prices])


def test_worth_switching_and_relative_gain():
    assert worth_switching(0.002, 1e-3) and not worth_switching(0.0005, 1e-3)
    assert not worth_switching(float("nan"), 1e-3)
    assert relative_gain(101.0, 100.0) == pytest.approx(0.01)
    assert relative_gain(5.0, 0.0) == float("inf") and relative_gain(float("nan"), 1.0) == float("-inf")
    with pytest.raises(InstanceError, match="threshold"):
        worth_switching(0.1, -1.0)


def _walk(target, current, resources, step):
    ticks = 0
    path = [current]
    while not np.array_equal(current, target) and ticks < 200:
        current = step_toward(
            target,
            current,
            max_step=step,
            price_min=resources.price_min,
            price_max=resources.price_max,
            band_pairs=resources.band_pairs,
        )
        path.append(current)
        ticks += 1
    return path


def test_step_toward_keeps_every_promise_on_the_way():
    problem = coupled_problem(30, 6, 1, drainable=True)
    res = problem.resources
    target = solve_equilibrium(problem).prices
    rng = np.random.default_rng(2)
    for _ in range(5):
        g = res.price_min[0::2] * (res.price_max[0::2] / res.price_min[0::2]) ** rng.random(3)
        start = np.empty(6)
        start[0::2], start[1::2] = g, g * rng.uniform(0.4, 0.8, 3)  # inside the 20-60% band
        start = np.clip(start, res.price_min, res.price_max)
        path = _walk(target, start, res, 0.1)
        assert np.array_equal(path[-1], target)
        for before, after in zip(path, path[1:]):
            assert np.all(np.abs(after - before) <= 0.1 * before * (1 + 1e-12))
            assert np.all(after >= res.price_min) and np.all(after <= res.price_max)
            for pair in res.band_pairs:
                ratio = after[pair.drainable] / after[pair.guaranteed]
                assert 1 - pair.discount_max - 1e-12 <= ratio <= 1 - pair.discount_min + 1e-12


def test_step_toward_moves_a_pool_by_one_shared_fraction():
    problem = coupled_problem(10, 4, 0, drainable=True)
    res = problem.resources
    c0, c2 = res.unit_cost[0], res.unit_cost[2]
    current = np.array([2.0 * c0, 1.4 * c0, 2.0 * c2, 1.4 * c2])
    target = np.array([4.0 * c0, 2.0 * c0, 2.0 * c2, 1.4 * c2])  # pool 0 moves, pool 1 stays
    out = step_toward(
        target,
        current,
        max_step=0.1,
        price_min=res.price_min,
        price_max=res.price_max,
        band_pairs=res.band_pairs,
    )
    # the guaranteed price may go 10% of the way, the drainable one 23%: both go 10%
    np.testing.assert_allclose(out[:2], [2.2 * c0, 1.46 * c0])
    np.testing.assert_array_equal(out[2:], current[2:])
    with pytest.raises(InstanceError, match="max_step"):
        step_toward(target, current, max_step=-0.1, price_min=res.price_min, price_max=res.price_max)
    with pytest.raises(InstanceError, match="target"):
        step_toward(target[:3], current, max_step=0.1, price_min=res.price_min, price_max=res.price_max)


def test_cold_solve_with_a_resource_nobody_buys():
    """A line over a price no tenant responds to screens no tenant at all (it used to crash)."""
    from market_test_helpers import resource, tenant

    from market_pipeline.market.problem import MarketProblem

    problem = MarketProblem.from_instance_json(
        {
            "resources": [
                resource("a", unit_cost=1.0, price_max=20.0),
                resource("b", unit_cost=1.0, price_max=20.0),
            ],
            "tenants": [tenant(f"t{j}", [4.0 + j, 0.0], [1.0, 1.0], budget=2.0 + j) for j in range(6)],
        }
    )
    report = solve_equilibrium(problem, settings=SolverSettings(global_full_after=0))  # far grid, refinement
    assert report.status == "converged" and report.screened_prices > 0
    assert report.demand[1] == 0.0
