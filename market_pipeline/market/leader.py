"""The leader: profit-maximising prices given the followers' exact best responses.

A trust-region Sl1QP (sequential quadratic programming) method on

    max_p  sum_r (p_r - c_r) D_r(p)   s.t.  D(p) <= C, bounds, per-tick step, discount band

with the exact gradient and Lagrangian Hessian from implicit differentiation (``sensitivity``),
so it converges quadratically near the solution; binding capacity is handled exactly by the
linearised rows D + J dp <= C (a Newton step on D_r(p) = C_r). Merit: profit minus
rho * sum (D - C)+ (an exact penalty), with a second-order correction against the Maratos
effect on curved capacity constraints.

Cost control: trial points far from the solution get followers solved only as exactly as
the next Newton step needs (an inexact-Newton forcing term); near the solution the previous
Hessian is reused (chord steps); every point that passes the KKT test is evaluated exactly.

Kinks: demand bends where a tenant's budget switches between binding and slack, so with few
tenants the optimum can sit on a kink where no single gradient vanishes. When the trust region
has shrunk without progress, gradients of the pieces met by rejected trials are kept (with
their Hessians, carried to the current point) and the step QP maximises the concave max-min
model over the pieces; its multipliers make the KKT residual the nonsmooth (Clarke) one
(near a solution, the least over the active constraints' multipliers: ``kkt_polish``).
Accepted max-min steps carry the pieces along (a ridge of kinks is walked, not relearned);
only pieces sampled near the point certify it, and the kink search solves followers finer
than their noise in profit (``kink_tolerance``).

Safeguards (seed section 6.1): all tenants respond to the same price vector in every
iteration (synchronous); the trust region shrinks on rejected steps (adaptive step), and per
resource on oscillation (a step reversing the previous one without halving); while
oscillating, steps are smoothed by beta (p += (1 - beta) dp, i.e. to first order
d <- beta d + (1 - beta) BR(p + dp), with the followers kept at their exact best response).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market_pipeline.market.errors import SolverError
from market_pipeline.market.kkt_polish import best_multipliers
from market_pipeline.market.leader_kinks import (
    add_piece,
    kink_gradients,
    oscillation_guard,
    recentred,
    sampled_near,
)
from market_pipeline.market.leader_point import (
    LeaderContext,
    Point,
    evaluate,
    follower_tolerance,
    is_exact,
    kink_tolerance,
    local_model,
    solved_exactly,
    time_left,
    trial_point,
)
from market_pipeline.market.leader_step import (
    KKTParts,
    LocalModel,
    StepSolution,
    kkt_parts,
    model_gain,
    solve_step,
)
from market_pipeline.market.sensitivity import Derivatives

ACCEPT_RATIO = 1e-4
KINK_TRUST = 1e-5  # trust radius (share of the price range) below which kinks are looked for
CHORD_RESIDUAL = 1e-3  # KKT residual below which the previous point's Hessian is reused


@dataclass(frozen=True, eq=False)
class LeaderResult:
    point: Point
    derivatives: Derivatives
    step: StepSolution
    kkt: KKTParts
    iterations: int
    converged: bool
    capacity_infeasible: bool
    stop_reason: str | None
    curvature: np.ndarray  # the Lagrangian Hessian used at the final point
    best_feasible: Point | None  # the most profitable capacity-feasible point visited
    nonsmooth: bool = False  # certified by the kink (bundle) test rather than a single gradient


def _linearised_violation(model: LocalModel, delta: np.ndarray) -> float:
    capped = np.isfinite(model.capacity)
    over = model.demand[capped] + model.jacobian[capped] @ delta - model.capacity[capped]
    return float(np.maximum(over, 0.0).sum())


def _capacity_scale(model: LocalModel) -> float:
    capped = np.isfinite(model.capacity)
    return max(float(np.abs(model.capacity[capped]).max(initial=0.0)), 1e-300)


def _solve_step_with_penalty(
    model: LocalModel,
    ctx: LeaderContext,
    radius: np.ndarray,
    rho: float,
    active_guess: np.ndarray | None,
    kink_gradients: np.ndarray | None,
) -> StepSolution:
    """Raise the penalty while that reduces the linearised capacity violation of the step
    (when the box alone makes capacity unreachable, no penalty helps and rho stays)."""
    step = solve_step(
        model, ctx.constraints, radius, rho, active_guess=active_guess, kink_gradients=kink_gradients
    )
    violation = _linearised_violation(model, step.delta)
    scale = max(float(np.abs(model.demand).max()), 1e-300)
    for _ in range(4):
        if violation <= 1e-12 * scale:
            break
        candidate = solve_step(
            model,
            ctx.constraints,
            radius,
            rho * 10.0,
            active_guess=step.active_rows,
            kink_gradients=kink_gradients,
        )
        reduced = _linearised_violation(model, candidate.delta)
        if reduced >= violation - 1e-9 * scale:
            break
        step, violation, rho = candidate, reduced, rho * 10.0
    return step


def run_leader(
    ctx: LeaderContext,
    start: np.ndarray,
    *,
    tolerance: float,
    max_iterations: int,
    multiplier: np.ndarray | None = None,
    radius: float | None = None,
    curvature: np.ndarray | None = None,
    cold: bool = False,
) -> LeaderResult:
    """``curvature``: a Lagrangian Hessian estimate at ``start`` (e.g. from a subsample) used for
    the first step instead of computing the exact one. ``cold``: ``start`` is a guess far from
    the solution, so its followers are solved loosely (see ``follower_tolerance``)."""
    constraints = ctx.constraints
    span = np.maximum(constraints.upper - constraints.lower, 1e-12 * np.maximum(1.0, constraints.upper))
    point = evaluate(ctx, start, tol=follower_tolerance(ctx.settings, 1.0) if cold else None)
    mu = np.zeros_like(start) if multiplier is None else np.asarray(multiplier, dtype=np.float64)
    rho = 10.0 * float(constraints.upper.max())
    trust = ctx.settings.initial_radius if radius is None else radius
    per_resource = np.ones_like(start)  # shrinks on oscillation
    smoothing_left = 0
    previous_delta: np.ndarray | None = None
    iterations = 0
    model, der = local_model(ctx, point, mu, curvature=curvature)
    # "exact", "estimate" (given for the first step) or "stale" (reused from the previous point)
    source = "exact" if curvature is None else "estimate"
    active_guess = None
    best = point if point.excess == 0.0 else None  # the best capacity-feasible point so far
    # (prices, gradient, Hessian, where sampled) of smooth pieces met across a kink
    bundle: list[tuple] = []
    while True:
        try:
            step = _solve_step_with_penalty(
                model,
                ctx,
                trust * span * per_resource,
                rho,
                active_guess,
                kink_gradients(bundle, point.prices, span),
            )
        except SolverError:
            if not bundle:
                raise
            bundle = []  # the max-min QP failed on these pieces (carried ones can conflict)
            continue
        active_guess = step.active_rows
        rho = step.rho
        kkt = kkt_parts(model, constraints, step)
        step, kkt = best_multipliers(model, constraints, step, kkt, tolerance, CHORD_RESIDUAL)
        total = max(kkt.total, point.state.budget_residual)
        if total <= tolerance and step.pieces.shape[0] > 1:
            near = sampled_near(bundle, point.prices, span)
            if len(near) < len(bundle):  # a kink certified by carried pieces: sample them afresh
                bundle = near
                continue
        if total <= tolerance:
            return LeaderResult(
                point,
                der,
                step,
                kkt,
                iterations,
                True,
                False,
                None,
                model.hessian,
                best,
                nonsmooth=step.pieces.shape[0] > 1,
            )
        if source == "stale" and total > CHORD_RESIDUAL:
            model, der = local_model(ctx, point, mu)
            source = "exact"
            continue
        # the elastic problem is solved (the residual excludes trust-region multipliers, so
        # stationarity here means the trust region is not what holds the prices) but capacity
        # cannot be met inside the price/step box
        stalled_infeasible = (
            kkt.feasibility > tolerance
            and max(kkt.stationarity, kkt.complementarity) <= tolerance
            and _linearised_violation(model, step.delta) > tolerance * _capacity_scale(model)
        )
        stop = None
        if stalled_infeasible:
            if not is_exact(ctx, point):  # the verdict is certified like a solution: exact followers
                point, model, der = solved_exactly(ctx, point, mu)
                source, bundle = "exact", []
                continue
            return LeaderResult(point, der, step, kkt, iterations, False, True, None, model.hessian, best)
        if iterations >= max_iterations:
            stop = f"no convergence within {max_iterations} leader iterations (KKT {total:.2e})"
        elif not time_left(ctx):
            stop = f"time budget exhausted after {iterations} leader iterations (KKT {total:.2e})"
        elif trust < 1e-14:
            stop = f"trust region collapsed after {iterations} leader iterations (KKT {total:.2e})"
        if stop is not None:
            return LeaderResult(point, der, step, kkt, iterations, False, False, stop, model.hessian, best)
        iterations += 1
        delta = step.delta * ((1.0 - ctx.settings.response_smoothing) if smoothing_left > 0 else 1.0)
        predicted = model_gain(model, step, delta)
        # kink search compares gradients across the kink: those need exact followers
        trial_tol = (
            kink_tolerance(ctx.settings)
            if trust <= 4 * KINK_TRUST
            else follower_tolerance(ctx.settings, total)
        )
        trial = trial_point(ctx, point, der, delta, trial_tol)
        actual = trial.merit(rho) - point.merit(rho)
        noise = 1e-13 * (abs(point.merit(rho)) + 1.0)
        if trust <= 4 * KINK_TRUST:
            # followers solved to a relative budget residual e move the revenue by ~e of itself:
            # a kink-scale trial that loses less than that has not been shown to lose
            noise += trial_tol * abs(float(point.prices @ point.demand))
        accepted = actual >= ACCEPT_RATIO * predicted - noise
        if not accepted and trial.excess > point.excess:
            trial, delta, accepted = _second_order_correction(
                ctx, model, step, point, der, delta, trial, predicted, noise, trial_tol
            )
        if not accepted:
            if source != "exact":  # blame the curvature before the step length
                model, der = local_model(ctx, point, mu)
                source = "exact"
                continue
            reach = float(np.max(np.abs(delta) / span)) if np.any(delta) else trust
            trust = 0.25 * min(trust, reach)
            if trust <= KINK_TRUST:
                if not is_exact(ctx, point, kink_tolerance(ctx.settings)):
                    point, model, der = solved_exactly(ctx, point, mu, kink_tolerance(ctx.settings))
                    source, bundle = "exact", []
                    continue
                # (this overwrites the point's derivative buffers, so the multiplier predictor
                # of later trials is approximate: it only warm-starts them)
                # a carried piece that let a step fail is dropped for the one just sampled
                near = sampled_near(bundle, point.prices, span)
                bundle = add_piece(near, _piece(ctx, trial), point.prices, model.gradient)
            continue
        ratio = actual / predicted if predicted > noise else 1.0
        if ratio > 0.75 and np.any(np.abs(delta) >= 0.99 * trust * span * per_resource):
            trust = min(2.0 * trust, 1.0)
        per_resource, smoothing_left = oscillation_guard(delta, previous_delta, per_resource, smoothing_left)
        previous_delta = delta
        point, mu = trial, step.capacity_multiplier
        if step.pieces.shape[0] > 1:
            bundle = recentred(bundle, point.prices)
        if point.excess == 0.0 and (best is None or point.profit > best.profit):
            best = point
        # Close to the solution Newton barely moves, so the last Hessian is nearly exact: reuse
        # it (a chord step, contraction ~ the relative change of the Hessian) instead of paying
        # for a new one; it is recomputed as soon as a step fails or the residual is not small.
        reuse = total <= CHORD_RESIDUAL and smoothing_left == 0
        model, der = local_model(ctx, point, mu, curvature=model.hessian if reuse else None)
        source = "stale" if reuse else "exact"


def _piece(ctx: LeaderContext, trial: Point) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prices, profit gradient, profit Hessian, prices) of the smooth piece a rejected trial
    lies on (the last entry: where it was sampled, kept when the piece is carried)."""
    model, _ = local_model(ctx, trial, np.zeros_like(trial.prices))
    return trial.prices, model.gradient, model.hessian, trial.prices


def _second_order_correction(ctx, model, step, point, der, delta, trial, predicted, noise, tol):
    """Re-linearise capacity at the trial point (D(p+dp) + J (dp' - dp) <= C) and retry once."""
    shifted = ctx.capacity - trial.demand + model.jacobian @ delta
    span = ctx.constraints.upper - ctx.constraints.lower
    radius = np.maximum(np.abs(delta) * 1.5, 1e-12 * np.maximum(span, 1.0))
    try:
        corrected = solve_step(
            model,
            ctx.constraints,
            np.maximum(radius, np.abs(step.delta)),
            step.rho,
            shifted,
            kink_gradients=step.pieces[1:] if step.pieces.shape[0] > 1 else None,
        )
    except SolverError:
        return trial, delta, False
    soc_trial = trial_point(ctx, point, der, corrected.delta, tol)
    actual = soc_trial.merit(step.rho) - point.merit(step.rho)
    if actual >= ACCEPT_RATIO * predicted - noise:
        return soc_trial, corrected.delta, True
    return trial, delta, False
