"""The leader's points: the followers' exact best responses at given prices, and the local
model (profit gradient, demand Jacobian, Lagrangian Hessian) there.

Trial points far from the solution get followers solved only as exactly as the next Newton
step needs (``follower_tolerance``); a point that may be certified is solved again exactly
(``solved_exactly``). Two workspace slots hold the current point's and a trial's tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.errors import SolverError
from market_pipeline.market.followers import FollowerState, solve_followers
from market_pipeline.market.leader_step import LocalModel
from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.report import SolverSettings
from market_pipeline.market.sensitivity import Derivatives, demand_derivatives

KINK_PRECISION = 1e-2  # the kink search's follower tolerance, a share of the configured one


@dataclass
class LeaderContext:
    pop: DevicePopulation
    constraints: PriceConstraints
    unit_cost: np.ndarray
    capacity: np.ndarray
    settings: SolverSettings
    deadline: float | None = None
    follower_iterations: int = 0

    @property
    def device(self) -> torch.device:
        return self.pop.device


@dataclass(frozen=True, eq=False)
class Point:
    prices: np.ndarray
    state: FollowerState
    demand: np.ndarray
    profit: float  # smooth profit sum (p - c) D
    excess: float  # sum over capped resources of (D - C)+
    slot: int  # workspace slot holding the follower state's tensors

    def merit(self, rho: float) -> float:
        return self.profit - rho * self.excess


def follower_tolerance(settings: SolverSettings, leader_residual: float) -> float:
    """Inexact Newton: far from the solution the followers need not be exact for a good leader
    step. Newton squares the leader's residual, so the next point needs followers accurate to
    about that square: their tolerance tracks it, down to the configured one (which every
    point that can pass the KKT test gets)."""
    return max(settings.follower_tolerance, min(1e-5, 1e-4 * leader_residual**2))


def evaluate(
    ctx: LeaderContext,
    prices: np.ndarray,
    scale_guess: torch.Tensor | None = None,
    *,
    slot: int = 0,
    tol: float | None = None,
) -> Point:
    settings = ctx.settings
    p = torch.as_tensor(prices, dtype=torch.float64, device=ctx.device)
    tol = settings.follower_tolerance if tol is None else tol
    state = solve_followers(
        ctx.pop, p, scale_guess, tol=tol, max_iterations=settings.follower_max_iterations, slot=slot
    )
    ctx.follower_iterations += state.iterations
    if not state.budget_residual <= max(1e-8, 10.0 * tol):
        raise SolverError(
            f"followers: budget multiplier root not found (residual {state.budget_residual:.2e})"
        )
    demand = ctx.pop.aggregate(state.demand).cpu().numpy()
    if not np.all(np.isfinite(demand)):
        raise SolverError("followers: non-finite demand")
    capped = np.isfinite(ctx.capacity)
    excess = float(np.maximum(demand[capped] - ctx.capacity[capped], 0.0).sum())
    return Point(
        np.asarray(prices, dtype=np.float64),
        state,
        demand,
        float((prices - ctx.unit_cost) @ demand),
        excess,
        slot,
    )


def local_model(
    ctx: LeaderContext, point: Point, multiplier: np.ndarray, curvature: np.ndarray | None = None
) -> tuple[LocalModel, Derivatives]:
    """Exact first derivatives at ``point``; the Lagrangian Hessian too unless ``curvature``
    (a previous one) is passed in, which is enough to certify a point (the multipliers of the
    step QP at a KKT point do not depend on it)."""
    cost = torch.as_tensor(ctx.unit_cost, dtype=torch.float64, device=ctx.device)
    mu = torch.as_tensor(multiplier, dtype=torch.float64, device=ctx.device)
    der = demand_derivatives(ctx.pop, point.state, cost, mu, with_hessian=curvature is None)
    hessian = curvature if curvature is not None else der.lagrangian_hessian.cpu().numpy()
    model = LocalModel(
        point.prices,
        point.demand,
        ctx.capacity,
        ctx.unit_cost,
        der.profit_gradient.cpu().numpy(),
        der.jacobian.cpu().numpy(),
        hessian,
    )
    for name in ("gradient", "jacobian", "hessian"):
        if not np.all(np.isfinite(getattr(model, name))):
            raise SolverError(f"leader: non-finite {name} at prices {point.prices.tolist()}")
    return model, der


def trial_point(ctx: LeaderContext, point: Point, der: Derivatives, delta: np.ndarray, tol: float) -> Point:
    """Followers at p + delta, in the other workspace slot than ``point``'s."""
    prices = np.clip(point.prices + delta, ctx.constraints.lower, ctx.constraints.upper)
    move = torch.as_tensor(prices - point.prices, dtype=torch.float64, device=ctx.device)
    guess = point.state.scale + der.multiplier_gradient @ move  # first-order multiplier predictor
    return evaluate(ctx, prices, guess, slot=1 - point.slot, tol=tol)


def kink_tolerance(settings: SolverSettings) -> float:
    """Followers' tolerance in the kink search: its trials move the prices by ~1e-5 of their
    range and gain about that share of the KKT residual, while followers solved to a relative
    budget residual e bend the profit by ~e; at the configured tolerance that noise can
    exceed every gain, and the trust region collapses with an ascent direction in hand."""
    return settings.follower_tolerance * KINK_PRECISION


def is_exact(ctx: LeaderContext, point: Point, tol: float | None = None) -> bool:
    """Whether the point's followers were solved to ``tol`` (default: the configured tolerance;
    trial points far from the solution are solved more loosely, see ``follower_tolerance``)."""
    return point.state.budget_residual <= 10 * (ctx.settings.follower_tolerance if tol is None else tol)


def solved_exactly(
    ctx: LeaderContext, point: Point, multiplier: np.ndarray, tol: float | None = None
) -> tuple[Point, LocalModel, Derivatives]:
    """The point again with exact followers (to ``tol``, default the configured tolerance; in
    its own workspace slot), and its local model."""
    point = evaluate(ctx, point.prices, point.state.scale, slot=point.slot, tol=tol)
    model, der = local_model(ctx, point, multiplier)
    return point, model, der


def time_left(ctx: LeaderContext) -> bool:
    return ctx.deadline is None or time.perf_counter() < ctx.deadline
