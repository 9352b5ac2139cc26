"""A simulator tick that used to abort the solve: 32 budget-bound tenants, 14 resources, a
trust region shrunk to the kink search next to prices sitting at their bounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from market_pipeline.market import MarketProblem, solve_equilibrium

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
        np.testing.assert_allclose(report.prices, np.clip(last, problem.resources.price_min,
                                                          problem.resources.price_max))
