"""A multistart reference for the global phase: SciPy SLSQP from many independent starts.

Each start runs ``scipy.optimize.minimize`` (SLSQP) on the profit, with capacity and band
constraints, from a random log-uniform price vector (projected into the bands). The follower
response is exact and computed independently of the engine: per tenant the closed-form demand
at a budget multiplier and a geometric bisection on it (numpy, vectorised over tenants and
price vectors); gradients by forward differences, the M + 1 points in one batch. The best
capacity-feasible end point over all starts is the reference optimum (``bench global``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.problem import MarketProblem

BISECTION_STEPS = 60
FD_STEP = 1e-7  # relative forward-difference step
FEASIBILITY = 1e-6  # relative capacity excess still counted as feasible


@dataclass(frozen=True)
class ReferenceResult:
    prices: np.ndarray | None  # the best feasible end point
    profit: float
    profits: tuple[float, ...]  # every start's feasible end profit (-inf when infeasible)
    seconds: float


class ExactDemand:
    """Aggregate best-response demand at a batch of price vectors, numpy only."""

    def __init__(self, problem: MarketProblem) -> None:
        pop = problem.tenants
        self.w, self.s = pop.weight.numpy()[None], pop.saturation.numpy()[None]
        self.eta = pop.eta.numpy()[None, :, None]
        self.delay = 0.0 if pop.delay_cost is None else pop.delay_cost.numpy()[None]
        self.budget = pop.budget.numpy()[None, :]
        self.mult = np.ones(pop.size) if pop.multiplicity is None else pop.multiplicity.numpy()
        self.family = np.array(pop.families)[None, :, None]

    def _demand(self, a: np.ndarray, p: np.ndarray) -> np.ndarray:
        y = a[..., None] * p + self.delay
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log = self.w / y - self.s
            iso = self.s * ((self.w / self.s / y) ** (1.0 / self.eta) - 1.0)
            quad = np.where(self.w > 0, self.s * (1.0 - y / np.where(self.w > 0, self.w, 1.0)), 0.0)
        d = np.where(self.family == "log", log, np.where(self.family == "isoelastic", iso, quad))
        return np.maximum(np.nan_to_num(d, nan=0.0, neginf=0.0, posinf=0.0), 0.0)

    def __call__(self, prices: np.ndarray) -> np.ndarray:
        p = np.asarray(prices, dtype=np.float64)[:, None, :]  # (K, 1, M)
        if np.all(self.family == "log") and np.all(self.delay == 0):
            return np.einsum("knm,n->km", self._demand(self._log_multiplier(p), p), self.mult)
        ones = np.ones((p.shape[0], self.budget.shape[1]))
        spend = lambda a: (self._demand(a, p) * p).sum(axis=-1)  # noqa: E731
        bound = spend(ones) > self.budget
        low, high = ones.copy(), ones.copy()
        while True:  # grow the bracket until every bound tenant is under budget
            over = bound & (spend(high) > self.budget)
            if not over.any():
                break
            high = np.where(over, high * 4.0, high)
        for _ in range(BISECTION_STEPS):
            mid = np.sqrt(low * high)
            over = spend(mid) > self.budget
            low, high = np.where(over, mid, low), np.where(over, high, mid)
        a = np.where(bound, high, 1.0)  # high: never over budget
        return np.einsum("knm,n->km", self._demand(a, p), self.mult)

    def _log_multiplier(self, p: np.ndarray) -> np.ndarray:
        """Log tenants without delay, exactly: with active set A the budget gives
        a = sum_A w / (B + sum_A s p); starting from the set active at a = 1 and dropping what
        leaves the basket at each a (a only grows) settles within M steps."""
        active = self.w > p * self.s  # (K, N, M) at a = 1
        spend_one = np.where(active, self.w - self.s * p, 0.0).sum(axis=-1)
        bound = spend_one > self.budget
        budget = np.where(np.isfinite(self.budget), self.budget, 0.0)
        a = np.ones(spend_one.shape)
        for _ in range(p.shape[-1] + 1):
            total_w = np.where(active, self.w, 0.0).sum(axis=-1)
            a = np.where(
                bound,
                np.maximum(total_w / (budget + np.where(active, self.s * p, 0.0).sum(axis=-1)), 1.0),
                1.0,
            )
            still = active & (self.w > a[..., None] * p * self.s)
            if np.array_equal(still, active):
                break
            active = still
        return a


def reference_optimum(
    problem: MarketProblem, *, starts: int = 100, seed: int = 0, max_iterations: int = 100
) -> ReferenceResult:
    started = time.perf_counter()
    res = problem.resources
    constraints = PriceConstraints.build(res)
    demand = ExactDemand(problem)
    capped = np.isfinite(res.capacity)
    cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def at(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Demand at p and its forward-difference Jacobian (M x M), one batch."""
        key = p.tobytes()
        if key not in cache:
            h = FD_STEP * np.maximum(p, 1e-12)
            batch = np.vstack([p, p + np.diag(h)])
            d = demand(batch)
            cache.clear()
            cache[key] = (d[0], ((d[1:] - d[0]) / h[:, None]).T)
        return cache[key]

    def objective(p):
        d, _ = at(p)
        return -float((p - res.unit_cost) @ d)

    def gradient(p):
        d, jac = at(p)
        return -(d + jac.T @ (p - res.unit_cost))

    cons = [
        {
            "type": "ineq",
            "fun": lambda p: res.capacity[capped] - at(p)[0][capped],
            "jac": lambda p: -at(p)[1][capped],
        }
    ]
    if constraints.band_matrix.size:
        cons.append(
            {
                "type": "ineq",
                "fun": lambda p: -(constraints.band_matrix @ p),
                "jac": lambda p: -constraints.band_matrix,
            }
        )
    rng = np.random.default_rng(seed)
    bounds = list(zip(res.price_min, res.price_max))
    profits, best, best_prices = [], -np.inf, None
    for _ in range(starts):
        start = constraints.project(res.price_min * (res.price_max / res.price_min) ** rng.random(res.size))
        out = minimize(
            objective,
            start,
            jac=gradient,
            method="SLSQP",
            bounds=bounds,
            constraints=cons,
            options={"maxiter": max_iterations, "ftol": 1e-12},
        )
        p = np.clip(out.x, res.price_min, res.price_max)
        d = demand(p[None])[0]
        feasible = np.all(d[capped] <= res.capacity[capped] * (1 + FEASIBILITY)) and constraints.violation(
            p
        ) <= 1e-9 * float(p.max())
        profit = float((p - res.unit_cost) @ d) if feasible else -np.inf
        profits.append(profit)
        if profit > best:
            best, best_prices = profit, p
    return ReferenceResult(best_prices, best, tuple(profits), time.perf_counter() - started)
