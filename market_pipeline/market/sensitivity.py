"""Implicit derivatives of the aggregate demand D(p) through the followers' KKT conditions.

For a tenant with a = 1 + lambda and y_r = a p_r + delay_r, on the active set
d_r = g_r(y_r) with slope gamma_r = g'_r(y_r) and curvature gamma'_r = g''_r(y_r). When the
budget binds, differentiating p . d(p) = B gives

    dlambda/dp = Lambda = -(d + a p*gamma) / G,        G = sum_r p_r^2 gamma_r  (< 0)
    dd/dp      = a diag(gamma) + (gamma*p) Lambda^T    (diagonal plus rank one)

and Lambda = 0 when the budget is slack. Summing over tenants gives the M x M Jacobian as a
diagonal plus one (M x N)(N x M) product. Differentiating the budget identity twice gives
the Hessian of lambda, and with it the Hessian of Psi(p) = v . D(p) for a fixed v:

    sum_j diag(alpha_j) + Z^T Lambda + Lambda^T Z,   with per-tenant vectors
    alpha = a^2 gamma' (v - tau p) - 2 a tau gamma,           tau = (v . gamma p) / G,
    x     = a gamma' p (v - tau p) + gamma (v - 2 tau p),
    kappa = (gamma' . v p^2) - tau (gamma' . p^3),            Z = x + kappa Lambda / 2.

No inner iteration is unrolled: everything is evaluated at the converged best response.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from market_pipeline.market.followers import FollowerState
from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.utility import curvature_into, slope_into


@dataclass(frozen=True, eq=False)
class Derivatives:
    demand: torch.Tensor  # (M,) aggregate D(p)
    jacobian: torch.Tensor  # (M, M), jacobian[r, k] = dD_r / dp_k
    profit_gradient: torch.Tensor  # (M,) gradient of sum_r (p_r - c_r) D_r(p)
    lagrangian_hessian: torch.Tensor | None  # (M, M) of sum (p - c - mu) . D(p)
    multiplier_gradient: torch.Tensor  # (N, M) dlambda_j / dp, for warm starts


def _slopes(
    pop: DevicePopulation, state: FollowerState, with_curvature: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    gamma, gamma2 = pop.buffer("gamma"), pop.buffer("gamma2")
    for block in pop.blocks:
        rows = slice(block.start, block.stop)
        y = state.effective_price[rows]
        slope_into(block, y, state.demand[rows], gamma[rows])
        if with_curvature:
            curvature_into(block, y, gamma[rows], gamma2[rows])
    return gamma, gamma2


def demand_derivatives(
    pop: DevicePopulation,
    state: FollowerState,
    unit_cost: torch.Tensor,
    capacity_multiplier: torch.Tensor | None = None,
    *,
    with_hessian: bool = True,
) -> Derivatives:
    """Derivatives at ``state``; the (N, M) results live in the workspace (valid until the
    next call)."""
    p, a, d = state.prices, state.scale, state.demand
    gamma, gamma2 = _slopes(pop, state, with_hessian)
    weight = pop.multiplicity if pop.multiplicity is not None else torch.ones_like(a)
    slope_sum = gamma @ (p * p)
    bound = a > 1.0
    inv_g = torch.where(bound, -1.0 / torch.where(bound, slope_sum, -1.0), 0.0)
    gamma_p = torch.mul(gamma, p, out=pop.buffer("gamma_p"))
    lam = torch.mul(gamma_p, a.unsqueeze(1), out=pop.buffer("lam"))
    lam.add_(d).mul_(inv_g.unsqueeze(1))  # dlambda/dp = -(d + a p gamma) / G
    lam_w = lam if pop.multiplicity is None else torch.mul(lam, weight.unsqueeze(1), out=pop.buffer("lam_w"))
    jacobian = torch.diag((weight * a) @ gamma) + gamma_p.T @ lam_w
    demand = pop.aggregate(d)
    margin = p - unit_cost
    profit_gradient = demand + jacobian.T @ margin
    hessian = None
    if with_hessian:
        v = margin if capacity_multiplier is None else margin - capacity_multiplier
        hessian = (
            jacobian
            + jacobian.T
            + _value_hessian(pop, p, a, v, gamma, gamma2, gamma_p, lam, lam_w, weight, inv_g, bound)
        )
    return Derivatives(demand, jacobian, profit_gradient, hessian, lam)


def _value_hessian(pop, p, a, v, gamma, gamma2, gamma_p, lam, lam_w, weight, inv_g, bound) -> torch.Tensor:
    """Hessian of v . D(p) with v held fixed (see the module docstring)."""
    tau = torch.where(bound, -(gamma_p @ v) * inv_g, 0.0)  # sigma / G, and inv_g = -1/G
    wa2 = weight * a * a
    curv_sums = gamma2.T @ torch.stack([wa2, wa2 * tau], dim=1)
    diagonal = v * curv_sums[:, 0] - p * curv_sums[:, 1] - gamma.T @ (2.0 * weight * a * tau)
    shifted = torch.outer(tau.neg(), p, out=pop.buffer("shifted")).add_(v)  # v - tau p
    x = torch.mul(gamma2, p, out=pop.buffer("x"))
    x.mul_(a.unsqueeze(1)).mul_(shifted)
    shifted.addcmul_(tau.unsqueeze(1), p.unsqueeze(0), value=-1.0)  # v - 2 tau p
    x.addcmul_(gamma, shifted)
    cubes = gamma2 @ torch.stack([v * p * p, p * p * p], dim=1)
    kappa = cubes[:, 0] - tau * cubes[:, 1]
    x.addcmul_(lam, (0.5 * kappa).unsqueeze(1))
    cross = x.T @ lam_w
    return torch.diag(diagonal) + cross + cross.T
