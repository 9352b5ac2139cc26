"""A straightforward nested SciPy solver, the reference the engine is benchmarked against.

Inner level: each tenant's problem on its own — the KKT demand for a given budget multiplier
and ``scipy.optimize.brentq`` on the budget equation. Outer level: ``scipy.optimize.minimize``
(SLSQP) on the profit with capacity and discount-band constraints, gradients by finite
differences (SciPy's default), follower results memoised per price vector so objective and
constraints share evaluations. Same model and same instance as the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, minimize

from market_pipeline.market.cold_start import identical_tenant_prices, initial_prices
from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.problem import MarketProblem


@dataclass(frozen=True)
class BaselineResult:
    prices: np.ndarray
    demand: np.ndarray
    profit: float
    seconds: float
    success: bool
    evaluations: int
    message: str


class _Tenants:
    """Per-tenant numpy rows and the scalar best response."""

    def __init__(self, problem: MarketProblem) -> None:
        pop = problem.tenants
        self.families = pop.families
        self.weight, self.saturation = pop.weight.numpy(), pop.saturation.numpy()
        self.budget, self.eta = pop.budget.numpy(), pop.eta.numpy()
        m = pop.num_resources
        self.delay = pop.delay_cost.numpy() if pop.delay_cost is not None else np.zeros((pop.size, m))
        self.mult = pop.multiplicity.numpy() if pop.multiplicity is not None else np.ones(pop.size)

    def _demand(self, j: int, prices: np.ndarray, lam: float) -> np.ndarray:
        w, s, y = self.weight[j], self.saturation[j], (1.0 + lam) * prices + self.delay[j]
        family = self.families[j]
        if family == "log":
            d = w / y - s
        elif family == "isoelastic":
            d = s * ((w / s / y) ** (1.0 / self.eta[j]) - 1.0)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                d = np.where(w > 0, s * (1.0 - y / np.where(w > 0, w, 1.0)), 0.0)
        return np.maximum(d, 0.0)

    def best_response(self, j: int, prices: np.ndarray) -> np.ndarray:
        d = self._demand(j, prices, 0.0)
        budget = self.budget[j]
        if not np.isfinite(budget) or prices @ d <= budget:
            return d
        high = 1.0
        while prices @ self._demand(j, prices, high) > budget:
            high *= 2.0
        lam = brentq(
            lambda x: prices @ self._demand(j, prices, x) - budget, 0.0, high, xtol=1e-14, rtol=1e-14
        )
        return self._demand(j, prices, lam)

    def aggregate(self, prices: np.ndarray) -> np.ndarray:
        return sum(self.mult[j] * self.best_response(j, prices) for j in range(len(self.families)))


def solve_baseline(
    problem: MarketProblem, *, max_iterations: int = 200, start: str = "identical"
) -> BaselineResult:
    """``start``: "identical" (the identical-tenant monopoly formula) or "grid" (the engine's
    cold start)."""
    if start not in ("identical", "grid"):
        raise ValueError(f"baseline start {start!r}: expected 'identical' or 'grid'")
    started = time.perf_counter()
    res = problem.resources
    tenants = _Tenants(problem)
    constraints = PriceConstraints.build(res)
    cache: dict[bytes, np.ndarray] = {}

    def demand(p: np.ndarray) -> np.ndarray:
        key = np.asarray(p, dtype=np.float64).tobytes()
        if key not in cache:
            cache[key] = tenants.aggregate(np.asarray(p, dtype=np.float64))
        return cache[key]

    capped = np.isfinite(res.capacity)
    cons = [{"type": "ineq", "fun": lambda p: res.capacity[capped] - demand(p)[capped]}]
    if constraints.band_matrix.size:
        cons.append(
            {
                "type": "ineq",
                "fun": lambda p: -(constraints.band_matrix @ p),
                "jac": lambda p: -constraints.band_matrix,
            }
        )
    guess = identical_tenant_prices(problem) if start == "identical" else initial_prices(problem)
    start_prices = constraints.project(guess)
    outcome = minimize(
        lambda p: -float((p - res.unit_cost) @ demand(p)),
        start_prices,
        method="SLSQP",
        bounds=list(zip(res.price_min, res.price_max)),
        constraints=cons,
        options={"maxiter": max_iterations, "ftol": 1e-10},
    )
    prices = np.clip(outcome.x, res.price_min, res.price_max)
    d = demand(prices)
    profit = float((prices - res.unit_cost) @ np.minimum(d, res.capacity))
    return BaselineResult(
        prices,
        d,
        profit,
        time.perf_counter() - started,
        bool(outcome.success),
        len(cache),
        str(outcome.message),
    )
