"""One leader step: the Sl1QP subproblem at the current prices and the KKT residual there.

Around prices p with exact derivatives (gradient g of the profit, Jacobian J of demand,
Hessian H of the Lagrangian with the capacity multipliers), the step solves

    max_dp  g.dp + 1/2 dp' H dp - rho * sum(xi)
    s.t.    D + J dp - xi <= C, xi >= 0     (capacity, linearised; elastic so always feasible)
            lower <= p + dp <= upper        (price bounds and the per-tick step)
            band (p + dp) <= 0              (drainable discount band)
            |dp_r| <= radius_r              (trust region)

H is made negative definite by mirroring/flooring its eigenvalues (the trust region keeps
the step honest when it is not). The multipliers of the linearised capacity rows are the
capacity shadow prices; with them the first-order KKT residual of the pricing problem at p
is measured directly on the true (not the linearised) quantities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg.lapack import dpotrf

from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.qp import solve_qp


@dataclass(frozen=True)
class LocalModel:
    """Derivatives at the current prices, as numpy arrays."""

    prices: np.ndarray
    demand: np.ndarray
    capacity: np.ndarray
    unit_cost: np.ndarray
    gradient: np.ndarray
    jacobian: np.ndarray
    hessian: np.ndarray


@dataclass(frozen=True)
class StepSolution:
    delta: np.ndarray  # (M,), zero on fixed prices
    capacity_multiplier: np.ndarray  # (M,), zero where capacity is unlimited
    objective_matrix: np.ndarray  # the regularised -H used (M x M)
    rho: float
    upper_mult: np.ndarray  # (M,) multipliers of p <= upper that are true bounds (0 otherwise)
    lower_mult: np.ndarray
    trust_mult: np.ndarray  # (M,) |multipliers| of trust-region rows
    band_mult: np.ndarray  # (K,)
    active_rows: np.ndarray  # bool per QP row: a warm start for the next step's QP
    pieces: np.ndarray  # (P, M) profit gradients of the pieces of the model (row 0: the point's own)
    gradient: np.ndarray  # (M,) their convex combination at the solution (the point's own if P = 1)


@dataclass(frozen=True)
class KKTParts:
    stationarity: float
    complementarity: float
    feasibility: float

    @property
    def total(self) -> float:
        return max(self.stationarity, self.complementarity, self.feasibility)


def regularised_curvature(hessian: np.ndarray) -> np.ndarray:
    """-H made symmetric positive definite (eigenvalues mirrored, then floored); as is when it
    already is (the usual case near a solution: one Cholesky instead of an eigendecomposition)."""
    sym = -0.5 * (hessian + hessian.T)
    _, info = dpotrf(sym, lower=1, clean=0)
    diagonal = np.diag(sym)
    if info == 0 and diagonal.min() > 1e-9 * diagonal.max():
        return sym
    values, vectors = np.linalg.eigh(sym)
    floor = max(1e-9 * float(np.abs(values).max()), 1e-300)
    values = np.maximum(np.abs(values), floor)
    return (vectors * values) @ vectors.T


@dataclass(frozen=True)
class _Layout:
    """The parts of the step QP that only depend on the constraint structure (cached)."""

    free: np.ndarray  # prices that are not fixed by their bounds
    capped: np.ndarray  # resources with finite capacity
    band_rows: np.ndarray  # band rows touching a free price
    template: np.ndarray  # G with the Jacobian block left zero
    first_guess: np.ndarray  # active rows to start from: the elastic slacks at zero
    all_free: bool  # no price is fixed (the usual case): plain slices instead of fancy indexing

    def free_block(self, matrix: np.ndarray) -> np.ndarray:
        return matrix if self.all_free else matrix[np.ix_(self.free, self.free)]


def _layout(constraints: PriceConstraints, capacity: np.ndarray) -> _Layout:
    capped_mask = np.isfinite(capacity)
    key = capped_mask.tobytes()
    if key in constraints.cache:
        return constraints.cache[key]
    free = np.flatnonzero(constraints.upper - constraints.lower > 1e-14 * np.maximum(1.0, constraints.upper))
    capped = np.flatnonzero(capped_mask)
    nf, nc = free.size, capped.size
    band = constraints.band_matrix[:, free]
    band_rows = np.any(band != 0, axis=1)
    eye_f, eye_c = np.eye(nf), np.eye(nc)
    template = np.vstack(
        [
            np.hstack([eye_f, np.zeros((nf, nc))]),
            np.hstack([-eye_f, np.zeros((nf, nc))]),
            np.hstack([np.zeros((nc, nf)), -eye_c]),
            np.hstack([np.zeros((nc, nf)), -eye_c]),  # capacity rows: J block filled per step
            np.hstack([band[band_rows], np.zeros((int(band_rows.sum()), nc))]),
        ]
    )
    first_guess = np.zeros(template.shape[0], dtype=bool)
    first_guess[2 * nf : 2 * nf + nc] = True
    layout = _Layout(free, capped, band_rows, template, first_guess, free.size == capacity.size)
    constraints.cache[key] = layout
    return layout


def solve_step(
    model: LocalModel,
    constraints: PriceConstraints,
    radius: np.ndarray,
    rho: float,
    capacity_rhs: np.ndarray | None = None,
    active_guess: np.ndarray | None = None,
    kink_gradients: np.ndarray | None = None,
) -> StepSolution:
    """Solve the step QP. ``capacity_rhs`` overrides C - D (for second-order corrections);
    ``active_guess`` is the previous step's active rows (tried first, verified).

    ``kink_gradients`` (K, M): profit gradients, at the point, of other smooth pieces meeting
    there (a kink). The linear term becomes the concave max-min model min_k g_k . dp, written
    with an epigraph variable t <= g_k . dp; the multipliers of those rows are the convex
    weights of the pieces, so the KKT residual becomes the nonsmooth (Clarke) one."""
    m = model.prices.shape[0]
    p = model.prices
    layout = _layout(constraints, model.capacity)
    free, capped, band_rows = layout.free, layout.capped, layout.band_rows
    nf, nc = free.size, capped.size
    pieces = (
        model.gradient[None, :] if kink_gradients is None else np.vstack([model.gradient, kink_gradients])
    )
    kink = pieces.shape[0] > 1
    curvature = regularised_curvature(model.hessian)
    upper_gap, lower_gap = constraints.upper[free] - p[free], p[free] - constraints.lower[free]
    step_up = np.minimum(np.maximum(upper_gap, 0.0), radius[free])
    step_down = np.minimum(np.maximum(lower_gap, 0.0), radius[free])
    if capacity_rhs is None:
        capacity_rhs = model.capacity - model.demand
    n = nf + nc + int(kink)
    Q = np.zeros((n, n))
    Q[:nf, :nf] = layout.free_block(curvature)
    G = layout.template.copy()
    G[2 * nf + nc : 2 * nf + 2 * nc, :nf] = model.jacobian[capped][:, free]
    h = np.concatenate(
        [step_up, step_down, np.zeros(nc), capacity_rhs[capped], -(constraints.band_matrix[band_rows] @ p)]
    )
    guess = layout.first_guess if active_guess is None else active_guess
    if kink:  # variables [dp, xi, t]: minimise -t, rows t - g_k . dp <= 0
        q = np.concatenate([np.zeros(nf), np.full(nc, rho), [-1.0]])
        epigraph = np.hstack(
            [-pieces[:, free], np.zeros((pieces.shape[0], nc)), np.ones((pieces.shape[0], 1))]
        )
        G = np.vstack([np.hstack([G, np.zeros((G.shape[0], 1))]), epigraph])
        h = np.concatenate([h, np.zeros(pieces.shape[0])])
        base_rows = layout.template.shape[0]
        base_guess = guess[:base_rows] if guess.size >= base_rows else layout.first_guess
        guess = np.concatenate([base_guess, np.ones(pieces.shape[0], dtype=bool)])
    else:
        q = np.concatenate([-model.gradient[free], np.full(nc, rho)])
    # Price steps in units of their box: a trust region shrunk to ~1e-6 of the price (kink
    # search) next to a price at its bound (gap ~1e-14) leaves the interior point method's
    # slacks at rounding level otherwise, and its dual residual never converges.
    column = np.ones(n)
    width = np.maximum(step_up, step_down)
    column[:nf] = np.maximum(width, 1e-12 * max(1.0, float(width.max(initial=0.0))))
    result = solve_qp(
        column[:, None] * Q * column[None, :],
        q * column,
        G * column[None, :],
        h,
        active_guess=guess if guess.shape[0] == h.shape[0] else None,
    )
    z = result.z
    weights = z[h.shape[0] - pieces.shape[0] :] if kink else np.ones(1)
    active_rows = z > 1e-9 * max(1.0, float(z.max(initial=0.0)))
    z_up, z_down = z[:nf], z[nf : 2 * nf]
    z_cap = z[2 * nf + nc : 2 * nf + 2 * nc]
    z_band = np.zeros(constraints.band_matrix.shape[0])
    z_band[band_rows] = z[2 * nf + 2 * nc : 2 * nf + 2 * nc + int(band_rows.sum())]
    delta = np.zeros(m)
    delta[free] = result.x[:nf] * column[:nf]
    true_up = upper_gap <= radius[free]
    true_down = lower_gap <= radius[free]
    upper_mult, lower_mult, trust_mult = np.zeros(m), np.zeros(m), np.zeros(m)
    upper_mult[free] = np.where(true_up, z_up, 0.0)
    lower_mult[free] = np.where(true_down, z_down, 0.0)
    trust_mult[free] = np.where(true_up, 0.0, z_up) + np.where(true_down, 0.0, z_down)
    capacity_multiplier = np.zeros(m)
    capacity_multiplier[capped] = z_cap
    if layout.all_free:
        full_curvature = Q[:nf, :nf].copy()
    else:
        full_curvature = np.zeros((m, m))
        full_curvature[np.ix_(free, free)] = Q[:nf, :nf]
    return StepSolution(
        delta,
        capacity_multiplier,
        full_curvature,
        rho,
        upper_mult,
        lower_mult,
        trust_mult,
        z_band,
        active_rows,
        pieces,
        weights @ pieces / max(float(weights.sum()), 1e-300),
    )


def gradient_scale(model: LocalModel) -> float:
    """What the stationarity residual is relative to: the larger of demand and the price
    effect J' (p - c), the two terms of the profit gradient."""
    return max(
        float(np.abs(model.demand).max()),
        float(np.abs(model.jacobian.T @ (model.prices - model.unit_cost)).max()),
        1e-300,
    )


def kkt_parts(model: LocalModel, constraints: PriceConstraints, step: StepSolution) -> KKTParts:
    """First-order KKT residual of the pricing problem at model.prices, relative, using the
    step's multipliers (trust-region multipliers excluded, so a truncated step never passes)."""
    p, demand, capacity = model.prices, model.demand, model.capacity
    capped = np.isfinite(capacity)
    free = constraints.upper - constraints.lower > 1e-14 * np.maximum(1.0, constraints.upper)
    cap_mult = step.capacity_multiplier
    residual = (
        -step.gradient
        + step.upper_mult
        - step.lower_mult
        + model.jacobian.T @ cap_mult
        + constraints.band_matrix.T @ step.band_mult
    )
    g_scale = gradient_scale(model)
    p_scale = max(float(np.abs(p).max()), 1e-300)
    stationarity = float(np.abs(residual[free]).max()) / g_scale if free.any() else 0.0
    slack_cap = np.where(capped, np.maximum(np.where(capped, capacity, 0.0) - demand, 0.0), 0.0)
    products = [
        cap_mult * slack_cap,
        step.upper_mult * np.maximum(constraints.upper - p, 0.0),
        step.lower_mult * np.maximum(p - constraints.lower, 0.0),
    ]
    if step.band_mult.size:
        products.append(step.band_mult * np.maximum(-(constraints.band_matrix @ p), 0.0))
    complementarity = max(float(np.abs(x).max()) for x in products) / (g_scale * p_scale)
    finite_cap = np.where(capped, capacity, 0.0)
    cap_floor = 1e-12 * max(1.0, float(finite_cap.max()))
    over = np.where(
        capped, (demand - finite_cap) / np.maximum(np.where(capped, capacity, 1.0), cap_floor), 0.0
    )
    feasibility = max(float(over.max()), 0.0)
    return KKTParts(stationarity, complementarity, feasibility)


def model_gain(model: LocalModel, step: StepSolution, delta: np.ndarray) -> float:
    """Predicted change of the merit (profit minus rho * capacity excess) for ``delta``."""
    capped = np.isfinite(model.capacity)
    cap = np.where(capped, model.capacity, 0.0)
    before = np.where(capped, np.maximum(model.demand - cap, 0.0), 0.0).sum()
    after = np.where(capped, np.maximum(model.demand + model.jacobian @ delta - cap, 0.0), 0.0).sum()
    quadratic = 0.5 * delta @ step.objective_matrix @ delta
    return float((step.pieces @ delta).min() - quadratic - step.rho * (after - before))
