"""A small dense convex QP solver (primal-dual interior point, Mehrotra predictor-corrector).

    minimise 1/2 x'Qx + q'x   subject to  Gx <= h

Sized for the leader's subproblem (M prices plus M elastic slacks, a few hundred rows), so
plain numpy and a Cholesky factorisation per iteration are enough. Rows and the objective
are scaled internally; the returned multipliers z >= 0 are in the caller's units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import qr
from scipy.linalg.lapack import dgesv, dpotrf, dpotrs

from market_pipeline.market.errors import SolverError

LOOSE_TOL = 1e-6  # dual residual accepted from a stalled interior point iteration (degenerate QPs)
INDEPENDENT_TOL = 1e-10  # an active row whose QR pivot is below this share of the largest is dependent


@dataclass(frozen=True)
class QPResult:
    x: np.ndarray
    z: np.ndarray  # multipliers of G x <= h
    slack: np.ndarray  # h - G x
    iterations: int


def _max_step(v: np.ndarray, dv: np.ndarray) -> float:
    """Largest alpha in (0, 1] with v + alpha dv >= 0."""
    falling = dv < 0
    if not falling.any():
        return 1.0
    return min(1.0, float((v[falling] / -dv[falling]).min()))


def _factor(matrix: np.ndarray) -> np.ndarray:
    jitter = 0.0
    scale = max(1.0, float(np.abs(np.diag(matrix)).max()))
    for _ in range(8):
        chol, info = dpotrf(matrix + jitter * np.eye(matrix.shape[0]) if jitter else matrix, lower=1, clean=0)
        if info == 0:
            return chol
        jitter = max(jitter * 100.0, 1e-14 * scale)
    raise SolverError("QP: the reduced KKT matrix is not positive definite")


def _solve(chol: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    x, info = dpotrs(chol, rhs, lower=1)
    if info != 0:
        raise SolverError(f"QP: triangular solve failed (info {info})")
    return x


def _independent(G: np.ndarray, active: np.ndarray) -> np.ndarray:
    """``active`` cut to linearly independent rows (QR with column pivoting on their
    transpose). A degenerate vertex (a kink step at a zero step: trust, slack and epigraph rows
    all binding) has more active rows than variables, and its KKT matrix is singular; the
    dependent rows hold at equality anyway and take no multiplier."""
    rows = np.flatnonzero(active)
    if rows.size == 0:
        return active
    r, pivots = qr(G[rows].T, mode="r", pivoting=True)
    diagonal = np.abs(np.diag(r))
    rank = int((diagonal > INDEPENDENT_TOL * max(float(diagonal[0]), 1e-300)).sum())
    if rank == rows.size:
        return active
    kept = np.zeros_like(active)
    kept[rows[pivots[:rank]]] = True
    return kept


def _kkt_solve(Q, q, G, h, active):
    n, k = q.shape[0], int(active.sum())
    Ga = G[active]
    kkt = np.zeros((n + k, n + k))
    kkt[:n, :n], kkt[:n, n:], kkt[n:, :n] = Q, Ga.T, Ga
    # LAPACK directly: numpy.linalg.solve's wrapper costs more than the solve at this size
    _, _, sol, info = dgesv(kkt, np.concatenate([-q, h[active]]), overwrite_a=1, overwrite_b=1)
    return sol if info == 0 and np.isfinite(sol).all() else None


def solve_with_active_set(
    Q: np.ndarray,
    q: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    active: np.ndarray,
    *,
    tol: float = 1e-10,
    max_rounds: int | None = None,
) -> QPResult | None:
    """Primal-dual active-set iteration from the guess ``active``: solve the KKT system with
    those rows as equalities, then add the violated rows and drop those with negative
    multipliers, until consistent. Cheap when the guess is close (the previous step's rows);
    None when it does not settle or a system is singular, and the caller falls back to the
    interior point method."""
    n = q.shape[0]
    max_rounds = max_rounds or 2 * n + 4
    active = active.copy()
    row_norm = np.abs(G).max(axis=1)
    seen: set[bytes] = set()
    for _ in range(max_rounds):
        key = np.packbits(active).tobytes()
        if key in seen:
            return None  # cycling
        seen.add(key)
        active = _independent(G, active)
        sol = _kkt_solve(Q, q, G, h, active)
        if sol is None:
            return None
        x, za = sol[:n], sol[n:]
        slack = h - G @ x
        z = np.zeros(h.shape[0])
        z[active] = za
        threshold = tol * (row_norm * (1.0 + np.abs(x).max()) + np.abs(h))
        violated = ~active & (slack < -threshold)
        negative = active & (z < -tol * (1.0 + np.abs(za).max(initial=0.0)))
        if not violated.any() and not negative.any():
            return QPResult(x, np.maximum(z, 0.0), np.maximum(slack, 0.0), 0)
        if int((active & ~negative).sum() + violated.sum()) > n:
            worst = int(np.argmin(np.where(violated, slack / np.maximum(row_norm, 1e-300), np.inf)))
            violated = np.zeros_like(violated)
            violated[worst] = True
        active = (active | violated) & ~negative
    return None


def solve_qp(
    Q: np.ndarray,
    q: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    *,
    tol: float = 1e-11,
    max_iterations: int = 100,
    active_guess: np.ndarray | None = None,
) -> QPResult:
    """The active-set iteration runs first from ``active_guess`` (bool per row, e.g. the
    previous solve's; default none active); the interior point method is the fallback."""
    if q.shape[0] == 0:
        # Nothing to choose (every price fixed by its bounds or a zero step, no capacity
        # slack): the empty point, if its rows hold.
        if np.any(h < -tol * np.maximum(1.0, np.abs(h))):
            raise SolverError("QP: infeasible (no variables and a row h < 0)")
        return QPResult(np.zeros(0), np.zeros(h.shape[0]), h.astype(np.float64, copy=True), 0)
    if active_guess is None or active_guess.shape != h.shape:
        active_guess = np.zeros(h.shape[0], dtype=bool)
    guessed = solve_with_active_set(Q, q, G, h, active_guess)
    if guessed is not None:
        return guessed
    m = h.shape[0]
    row_scale = np.maximum(np.abs(G).max(axis=1), 1e-300)
    Gs, hs = G / row_scale[:, None], h / row_scale
    obj_scale = max(float(np.abs(Q).max()), float(np.abs(q).max()), 1e-300)
    Qs, qs = Q / obj_scale, q / obj_scale
    # Initial point as in CVXOPT's coneqp: least-squares x, then shift s and z inside the orthant.
    x = _solve(_factor(Qs + Gs.T @ Gs), -qs + Gs.T @ hs)
    s = hs - Gs @ x
    z = -s.copy()
    s = s if s.min() > 0 else s + (1.0 - s.min())
    z = z if z.min() > 0 else z + (1.0 - z.min())
    q_norm, h_norm = 1.0 + np.abs(qs).max(), 1.0 + np.abs(hs).max()
    for iteration in range(1, max_iterations + 1):
        r_dual = Qs @ x + qs + Gs.T @ z
        r_prim = Gs @ x + s - hs
        gap = float(s @ z)
        objective = 0.5 * x @ Qs @ x + qs @ x
        if (
            np.abs(r_dual).max() <= tol * q_norm
            and np.abs(r_prim).max() <= tol * h_norm
            and gap <= tol * max(1.0, abs(objective))
        ):
            return QPResult(x, z * obj_scale / row_scale, (hs - Gs @ x) * row_scale, iteration)
        weight = z / s
        chol = _factor(Qs + Gs.T @ (weight[:, None] * Gs))

        def direction(r_comp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            rhs = -r_dual - Gs.T @ (weight * r_prim) + Gs.T @ (r_comp / s)
            dx = _solve(chol, rhs)
            dz = weight * (Gs @ dx + r_prim) - r_comp / s
            ds = -(r_comp + s * dz) / z
            return dx, ds, dz

        dx, ds, dz = direction(s * z)
        alpha = min(_max_step(s, ds), _max_step(z, dz))
        mu = gap / m
        mu_aff = float((s + alpha * ds) @ (z + alpha * dz)) / m
        sigma = (mu_aff / mu) ** 3 if mu > 0 else 0.0
        dx, ds, dz = direction(s * z + ds * dz - sigma * mu)
        alpha = 0.99 * min(_max_step(s, ds), _max_step(z, dz))
        x, s, z = x + alpha * dx, s + alpha * ds, z + alpha * dz
        if not (np.isfinite(x).all() and np.isfinite(z).all()):
            raise SolverError("QP: non-finite iterate")
    r_dual, r_prim = Qs @ x + qs + Gs.T @ z, Gs @ x + s - hs
    gap = float(s @ z)
    # Degenerate problems (a kink step QP with more pieces active at a zero step than there
    # are variables: the multipliers are not unique) can stall the dual residual a little
    # above tol with a feasible, complementary iterate: return it; the leader's KKT test on
    # the true problem decides whether that point certifies.
    if (
        np.abs(r_dual).max() <= LOOSE_TOL * q_norm
        and np.abs(r_prim).max() <= tol * h_norm
        and gap <= tol * max(1.0, abs(0.5 * x @ Qs @ x + qs @ x))
    ):
        return QPResult(x, z * obj_scale / row_scale, (hs - Gs @ x) * row_scale, max_iterations)
    raise SolverError(
        f"QP: no convergence in {max_iterations} iterations "
        f"(dual {np.abs(r_dual).max():.1e}, primal {np.abs(r_prim).max():.1e}, gap {gap:.1e})"
    )
