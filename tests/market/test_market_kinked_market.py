"""Simulator ticks the engine used to get wrong (fixtures recorded from `simulate` runs): a
solve aborted by the step QP, a capacity-infeasible verdict lost to loose followers, and a
slow ridge of budget kinks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from market_pipeline.market.errors import SolverError
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import SolverSettings
from market_pipeline.market.solve import solve_equilibrium

FIXTURE = Path(__file__).parent / "fixtures" / "kinked_budget_market.json"


def test_step_qp_survives_a_tiny_trust_region_at_a_bound():
    data = json.loads(FIXTURE.read_text())
    problem = MarketProblem.from_instance_json(data["instance"])
    last = np.array(data["last_prices"])
    report = solve_equilibrium(problem, last_prices=last, max_step=data["max_step"])
    # the QP used to fail here ("QP: no convergence"), aborting before any step was taken
    assert "QP" not in (report.fallback_reason or "")
    assert np.all(np.isfinite(report.prices)) and np.all(report.prices > 0)
    assert np.all(report.prices <= problem.resources.price_max + 1e-12)
    assert np.all(report.prices >= problem.resources.price_min - 1e-12)
    if report.status == "fallback":
        np.testing.assert_allclose(
            report.prices, np.clip(last, problem.resources.price_min, problem.resources.price_max)
        )


def _fixture(name: str):
    data = json.loads((FIXTURE.parent / name).read_text())
    problem = MarketProblem.from_instance_json(data["instance"])
    return problem, np.array(data["last_prices"]), data["max_step"], data["tolerance"]


def test_capacity_infeasible_verdict_is_certified_with_exact_followers():
    """A simulator tick whose capacity cannot be met inside the step box: the leader stalled
    at a point whose followers were solved loosely (a trial point), and the certification of
    that point failed, so the tick fell back. The verdict now comes with exact followers."""
    problem, last, max_step, tolerance = _fixture("capacity_infeasible_market.json")
    report = solve_equilibrium(
        problem, last_prices=last, max_step=max_step, settings=SolverSettings(tolerance=tolerance)
    )
    assert report.status == "capacity_infeasible", report.fallback_reason
    assert report.follower_kkt <= tolerance
    assert report.capacity_violation > 0.5  # demand exceeds capacity even at the box's top prices


def test_slow_ridge_market_converges_within_the_shipped_iteration_cap():
    """Budget kinks all along the path: the leader needs a few hundred iterations here. The
    shipped `market.solver_max_iterations` must allow them (the old 200 fell back every tick)."""
    from market_pipeline.config import load_config
    from market_pipeline.tick.pricing import solver_settings

    problem, last, max_step, tolerance = _fixture("slow_ridge_market.json")
    settings = solver_settings(load_config())
    assert settings.tolerance == tolerance
    report = solve_equilibrium(problem, last_prices=last, max_step=max_step, settings=settings)
    assert report.status == "converged", report.fallback_reason
    assert report.kkt_residual <= tolerance


def test_a_solved_kink_certifies_once_its_multipliers_are_polished(monkeypatch):
    """Two `make demo` ticks (fixtures demo_kink_market_a/b): the leader reached the kink of one
    tenant's budget, but at the kink search's trust region (~1e-8 of the price range) the step
    QP's multipliers of inactive trust rows sat at ~1e-4, which the residual read as
    non-stationarity; the leader crawled to its 500 iterations and the tick fell back. The
    least residual over the active constraints' multipliers certifies it in a few dozen."""
    import market_pipeline.market.leader as leader

    for name in ("demo_kink_market_a.json", "demo_kink_market_b.json"):
        problem, last, max_step, tolerance = _fixture(name)
        settings = SolverSettings(tolerance=tolerance, max_iterations=500)
        report = solve_equilibrium(problem, last_prices=last, max_step=max_step, settings=settings)
        assert report.status == "converged", (name, report.fallback_reason)
        assert report.kkt_residual <= tolerance and report.iterations < 100
        assert report.profit > _profit_at(problem, last)  # it moved to a better price, not just stopped

    # the QP's own multipliers alone: the same tick crawls to the limit
    monkeypatch.setattr(leader, "best_multipliers", lambda model, constraints, step, kkt, *_: (step, kkt))
    problem, last, max_step, tolerance = _fixture("demo_kink_market_a.json")
    report = solve_equilibrium(
        problem,
        last_prices=last,
        max_step=max_step,
        settings=SolverSettings(tolerance=tolerance, max_iterations=150),
    )
    assert report.status == "fallback"


def _profit_at(problem: MarketProblem, prices: np.ndarray) -> float:
    from market_pipeline.market.solve import demand_at

    res = problem.resources
    return float((prices - res.unit_cost) @ np.minimum(demand_at(problem, prices), res.capacity))


def test_a_ridge_of_budget_kinks_is_walked_not_relearned():
    """Two simulator ticks (fixtures kink_ridge_market, long_ridge_market) whose optimum lies
    along a ridge where tenants' budgets switch. The max-min model's steps along it were
    accepted, but its pieces fell out of reach every 1% of the price range and were sampled
    again from a trust region shrunk to 1e-5: 500 iterations (KKT 1.5e-6 and 1.4e-2) and both
    ticks fell back to their last prices. The pieces now travel with accepted steps."""
    for name in ("kink_ridge_market.json", "long_ridge_market.json"):
        problem, last, max_step, tolerance = _fixture(name)
        report = solve_equilibrium(
            problem, last_prices=last, max_step=max_step, settings=SolverSettings(tolerance=tolerance)
        )
        assert report.status == "converged", (name, report.fallback_reason)
        assert report.kkt_residual <= tolerance and report.iterations < 300, name
        assert report.profit > _profit_at(problem, last) * (1 + 1e-3), name


def test_the_kink_search_outresolves_the_followers_noise():
    """A simulator tick (fixture noisy_kink_market) whose kink search compared trials solved to
    the followers' tolerance against a point solved less exactly: every trial, down to a step
    of 1e-15, read 3.7e-6 less profit than the point, the trust region collapsed with the KKT
    residual at 5 and the tick fell back. The search now solves both to a finer tolerance.
    Fixture noise_floor_market: even then a trial read 6e-9 (1e-12 of the profit) less at
    every step, at KKT 1.5e-6 against a tolerance of 1e-6; a kink-scale trial now fails only
    by more than its followers' tolerance can move the revenue."""
    for name in ("noisy_kink_market.json", "noise_floor_market.json"):
        problem, last, max_step, tolerance = _fixture(name)
        report = solve_equilibrium(
            problem, last_prices=last, max_step=max_step, settings=SolverSettings(tolerance=tolerance)
        )
        assert report.status == "converged", (name, report.fallback_reason)
        assert report.kkt_residual <= tolerance, name
        assert report.profit > _profit_at(problem, last), name


def test_a_failed_max_min_step_restarts_the_kink_search(monkeypatch):
    """The step QP can fail on a bundle of pieces carried along a ridge; the leader then drops
    the bundle and goes on, rather than abort the tick."""
    import market_pipeline.market.leader as leader

    real, failed = leader.solve_step, []

    def fails_once_with_pieces(*args, kink_gradients=None, **kwargs):
        if kink_gradients is not None and not failed:
            failed.append(True)
            raise SolverError("QP: no convergence in 100 iterations (test)")
        return real(*args, kink_gradients=kink_gradients, **kwargs)

    monkeypatch.setattr(leader, "solve_step", fails_once_with_pieces)
    problem, last, max_step, tolerance = _fixture("demo_kink_market_a.json")
    report = solve_equilibrium(
        problem, last_prices=last, max_step=max_step, settings=SolverSettings(tolerance=tolerance)
    )
    assert failed, "the kink search never ran: the fixture no longer exercises it"
    assert report.status == "converged", report.fallback_reason
