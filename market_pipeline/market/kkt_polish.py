"""Polished KKT multipliers: the least stationarity residual at a point over the multipliers of
the constraints active there.

The step QP's multipliers are one estimate of them, and a poor one where the trust region is
tiny (the kink search shrinks it to ~1e-8 of the price range): the QP is solved in units of the
box, so an interior-point tolerance of ~1e-12 there leaves the multipliers of the inactive
trust rows at ~1e-4 in price units. The residual excludes trust multipliers (a truncated step
must not pass), so it reads that noise as non-stationarity and a solved kink never certifies
(the leader then crawls to its iteration limit and the tick falls back). The KKT residual is
the least residual over valid multipliers, so with the active set known (price bounds met,
band rows at equality, full capacity rows) and the model's pieces (their convex weights), one
nonnegative least-squares solve gives it, the way OSQP "polishes" its ADMM iterates.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import nnls

from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.leader_step import (
    KKTParts,
    LocalModel,
    StepSolution,
    gradient_scale,
    kkt_parts,
)

ACTIVE_GAP = 1e-9  # a constraint within this share of its scale is active
SUM_WEIGHT = 1e4  # how hard the pieces' weights are held to sum to one (relative to the residual)


def polished(model: LocalModel, constraints: PriceConstraints, step: StepSolution) -> StepSolution:
    """`step` with the multipliers (pieces' weights, price bounds, band, capacity) that minimise
    the stationarity residual at `model.prices`, only active constraints taking any."""
    p, m = model.prices, model.prices.size
    free = constraints.upper - constraints.lower > 1e-14 * np.maximum(1.0, constraints.upper)
    price_gap = ACTIVE_GAP * max(1.0, float(np.abs(p).max()))
    at_upper = np.flatnonzero(constraints.upper - p <= price_gap)
    at_lower = np.flatnonzero(p - constraints.lower <= price_gap)
    band = constraints.band_matrix
    at_band = np.flatnonzero(-(band @ p) <= price_gap) if band.size else np.zeros(0, dtype=int)
    capped = np.isfinite(model.capacity)
    cap = np.where(capped, model.capacity, 0.0)
    cap_gap = ACTIVE_GAP * max(1.0, float(cap.max(initial=0.0)))
    full = np.flatnonzero(capped & (cap - model.demand <= cap_gap))
    pieces = step.pieces
    # Columns: sum_k w_k g_k - u + l - J' mu - B' beta = 0 on the free prices.
    columns = np.hstack(
        [
            pieces.T,
            -np.eye(m)[:, at_upper],
            np.eye(m)[:, at_lower],
            -model.jacobian[full].T,
            -band[at_band].T if band.size else np.zeros((m, 0)),
        ]
    )
    g_scale = gradient_scale(model)
    weights_row = np.zeros(columns.shape[1])
    weights_row[: pieces.shape[0]] = SUM_WEIGHT
    system = np.vstack([columns[free] / g_scale, weights_row])
    target = np.zeros(system.shape[0])
    target[-1] = SUM_WEIGHT
    solution, _ = nnls(system, target, maxiter=50 * system.shape[1])
    weights = solution[: pieces.shape[0]]
    if not weights.sum() > 0:
        return step
    weights = weights / weights.sum()
    rest = np.split(solution[pieces.shape[0] :], np.cumsum([at_upper.size, at_lower.size, full.size]))
    upper_mult, lower_mult, capacity_mult = np.zeros(m), np.zeros(m), np.zeros(m)
    upper_mult[at_upper], lower_mult[at_lower], capacity_mult[full] = rest[0], rest[1], rest[2]
    band_mult = np.zeros(band.shape[0])
    band_mult[at_band] = rest[3]
    return dataclasses.replace(
        step,
        gradient=weights @ pieces,
        upper_mult=upper_mult,
        lower_mult=lower_mult,
        capacity_multiplier=capacity_mult,
        band_mult=band_mult,
    )


def best_multipliers(
    model: LocalModel,
    constraints: PriceConstraints,
    step: StepSolution,
    kkt: KKTParts,
    tolerance: float = 0.0,
    near: float = float("inf"),
) -> tuple[StepSolution, KKTParts]:
    """The step's multipliers or their polished ones, whichever gives the smaller KKT residual;
    polished only where the step's residual is above `tolerance` and within `near` (close to
    a solution, where the QP's multipliers may be noise; far from it they steer the next step)."""
    if not tolerance < kkt.total <= near:
        return step, kkt
    try:
        candidate = polished(model, constraints, step)
    except (ValueError, RuntimeError, np.linalg.LinAlgError):
        return step, kkt
    measured = kkt_parts(model, constraints, candidate)
    return (candidate, measured) if measured.total < kkt.total else (step, kkt)
