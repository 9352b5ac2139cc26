"""Solver settings and the report every solve returns."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from market_pipeline.market.errors import InstanceError

STATUS_CONVERGED = "converged"
STATUS_CAPACITY_INFEASIBLE = "capacity_infeasible"
STATUS_FALLBACK = "fallback"


@dataclass(frozen=True)
class SolverSettings:
    """Knobs of the equilibrium solver (defaults suit both live ticks and the bench)."""

    tolerance: float = 1e-7  # KKT residual (leader and followers, relative) to call it converged
    # leader iterations over all phases; budget kinks all along the path can take a few
    # hundred (tests/market/fixtures/slow_ridge_market.json: 386), time_budget_s bounds the time
    max_iterations: int = 500
    time_budget_s: float | None = None  # wall-clock budget; exceeding it triggers the fallback
    follower_tolerance: float = 1e-9  # relative budget residual of each tenant's multiplier root
    follower_max_iterations: int = 80
    response_smoothing: float = 0.5  # beta: once prices oscillate, steps move (1 - beta) of the way
    initial_radius: float = 0.25  # trust region, as a share of each resource's price range
    # cold starts above this many tenants solve a subsample first (warm starts from last prices
    # do not: those are closer to the optimum than the subsample's sampling error)
    coarse_threshold: int = 32768
    coarse_tenants: int = 8192
    coarse_tolerance: float = 1e-4
    seed: int = 0  # for the subsample
    # torch intra-op threads on CPU during the solve (restored afterwards); None keeps torch's
    # setting. One by default: the kernels are memory-bound, and on a shared host OpenMP
    # threads spinning for a core they do not get make a solve several times slower. Raise it
    # on a dedicated host. numpy's BLAS is always held to one thread: it only sees M x M.
    threads: int | None = 1
    # The global phase of cold solves (``global_phase``): line searches through each local
    # optimum on a tenant sample; the leader restarts where one finds a better hump.
    global_phase: bool = True
    global_restarts: int = 3  # leader restarts at most
    global_points: int = 6  # grid points per price line (log-spaced over its feasible range)
    global_local_steps: tuple[float, ...] = (
        0.03,
        0.07,
        0.15,
        0.3,
    )  # and at the optimum's price x (1 + s)^(+-1)
    # The full screen (far grid, local steps, refinement) only after a local solve of more
    # leader iterations than this: one that converges in a few Newton steps met no budget kinks
    # on its way, and its screen probes at the optimum's prices x (1 + s)^(+-1) for s in
    # global_light_steps only.
    global_full_after: int = 8
    global_light_steps: tuple[float, ...] = (0.15,)
    global_refine_rounds: int = 2  # bracket halvings of the promising humps
    global_refine_lines: int = 4  # lines refined at most (the most promising)
    global_margin: float = 0.02  # a hump within this share of the incumbent's profit is refined
    global_min_gain: float = 1e-6  # relative gain over the incumbent for a restart
    global_sample: int = 1024  # tenants the screen runs on (a subsample above this)
    distinct_tolerance: float = 1e-2  # optima whose prices differ more (max relative) are distinct

    def __post_init__(self) -> None:
        checks = {
            "tolerance": 0 < self.tolerance < 1,
            "max_iterations": self.max_iterations >= 1,
            "time_budget_s": self.time_budget_s is None or self.time_budget_s > 0,
            "follower_tolerance": 0 < self.follower_tolerance < 1e-3,
            "follower_max_iterations": self.follower_max_iterations >= 1,
            "response_smoothing": 0 <= self.response_smoothing < 1,
            "initial_radius": 0 < self.initial_radius <= 1,
            "coarse_threshold": self.coarse_threshold >= 0,
            "coarse_tenants": self.coarse_tenants >= 16,
            "coarse_tolerance": 0 < self.coarse_tolerance < 1,
            "threads": self.threads is None or self.threads >= 1,
            "global_restarts": self.global_restarts >= 0,
            "global_points": self.global_points >= 2,
            "global_full_after": self.global_full_after >= 0,
            "global_local_steps": all(s > 0 for s in self.global_local_steps),
            "global_light_steps": all(s > 0 for s in self.global_light_steps),
            "global_refine_rounds": self.global_refine_rounds >= 0,
            "global_refine_lines": self.global_refine_lines >= 1,
            "global_margin": 0 <= self.global_margin < 1,
            "global_min_gain": 0 <= self.global_min_gain < 1,
            "global_sample": self.global_sample >= 16,
            "distinct_tolerance": 0 < self.distinct_tolerance < 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise InstanceError(f"solver settings: invalid {name}={getattr(self, name)!r}")


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _keyed_or_none(names: tuple[str, ...], values: np.ndarray) -> dict[str, float | None]:
    return {name: _finite_or_none(float(v)) for name, v in zip(names, values)}


@dataclass(frozen=True, eq=False)
class SolveReport:
    """Outcome of one equilibrium solve; arrays are aligned with ``resource_names``.

    ``status`` is "converged", "capacity_infeasible" (demand exceeds capacity even at
    price_max on the listed resources: prices are the best achievable, ``converged`` is
    False) or "fallback" (the solve failed; prices are the last certified ones, or the
    safe in-bounds price_max when none were given, and ``fallback_reason`` says why)."""

    resource_names: tuple[str, ...]
    prices: np.ndarray
    demand: np.ndarray
    capacity: np.ndarray
    capacity_price: np.ndarray  # shadow price (multiplier) of each capacity constraint
    profit: float
    kkt_residual: float
    follower_kkt: float
    leader_stationarity: float
    leader_complementarity: float
    capacity_violation: float  # max relative (D - C)+ over resources
    iterations: int
    follower_iterations: int
    seconds: float
    converged: bool
    status: str
    fallback_reason: str | None
    budget_bound_tenants: int
    tenants: int
    device: str
    # certified at a kink of the profit (a budget switching between binding and slack): the
    # stationarity residual is then the nonsmooth (Clarke) one over the pieces meeting there
    nonsmooth: bool = False
    # How sure the solve is of the global optimum (the global phase, cold solves; a warm solve
    # is one start): local solves started, distinct certified optima they reached, the best
    # other optimum's profit below this one (relative; None with a single optimum), and the
    # price vectors the line-search screen evaluated.
    starts: int = 1
    distinct_optima: int = 1
    alternative_gap: float | None = None
    screened_prices: int = 0

    def keyed(self, values: np.ndarray) -> dict[str, float]:
        return {name: float(v) for name, v in zip(self.resource_names, values)}

    @property
    def oversold(self) -> dict[str, float]:
        """Resources whose demand exceeds capacity, with the excess in GPU-hours."""
        excess = self.demand - self.capacity
        return {
            n: float(e)
            for n, e, c in zip(self.resource_names, excess, self.capacity)
            if e > 1e-9 * max(1.0, float(c))
        }

    def to_dict(self) -> dict:
        return {
            "prices": self.keyed(self.prices),
            "demand": _keyed_or_none(self.resource_names, self.demand),
            "capacity": {n: _finite_or_none(c) for n, c in zip(self.resource_names, self.capacity)},
            "capacity_price": self.keyed(self.capacity_price),
            "utilisation": {
                n: (_finite_or_none(float(d / c)) if c > 0 and math.isfinite(c) else None)
                for n, d, c in zip(self.resource_names, self.demand, self.capacity)
            },
            "oversold": self.oversold,
            "profit": _finite_or_none(self.profit),
            "kkt_residual": _finite_or_none(self.kkt_residual),
            "follower_kkt": _finite_or_none(self.follower_kkt),
            "leader_stationarity": _finite_or_none(self.leader_stationarity),
            "leader_complementarity": _finite_or_none(self.leader_complementarity),
            "capacity_violation": _finite_or_none(self.capacity_violation),
            "iterations": int(self.iterations),
            "follower_iterations": int(self.follower_iterations),
            "seconds": float(self.seconds),
            "converged": bool(self.converged),
            "status": self.status,
            "fallback_reason": self.fallback_reason,
            "budget_bound_tenants": int(self.budget_bound_tenants),
            "tenants": int(self.tenants),
            "device": self.device,
            "nonsmooth": bool(self.nonsmooth),
            "starts": int(self.starts),
            "distinct_optima": int(self.distinct_optima),
            "alternative_gap": None
            if self.alternative_gap is None
            else _finite_or_none(self.alternative_gap),
            "screened_prices": int(self.screened_prices),
        }
