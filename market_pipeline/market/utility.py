"""Concave utility families and their demand functions, vectorised over tenants x resources.

Per tenant j and resource r, with weight w >= 0 and saturation s > 0:

- ``log``:        U(d) = w log(1 + d/s)                U'(d) = w / (s + d)
- ``isoelastic``: U(d) = w ((1 + d/s)^(1-eta) - 1) / (1 - eta)
                                                       U'(d) = (w/s) (1 + d/s)^(-eta)
                  (eta = 1 is the log family; small eta = elastic, large eta = saturating fast)
- ``quadratic``:  U(d) = w (d - d^2 / (2 s)), d <= s   U'(d) = w (1 - d/s)   (linear demand)

Given the effective marginal price y = (1 + lambda) p + delay_cost (lambda the budget
multiplier), the first-order condition U'(d) = y inverts in closed form: d = g(y) clamped at 0.
The helpers below also return g' and g'' on the active set (0 where d = 0), which the implicit
derivatives need. U'(0) (the "choke" price) is where a resource enters a tenant's basket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOG = "log"
ISOELASTIC = "isoelastic"
QUADRATIC = "quadratic"
FAMILIES = (LOG, ISOELASTIC, QUADRATIC)


@dataclass(frozen=True, eq=False)
class FamilyBlock:
    """Tenants [start, stop) of one utility family, as device tensors (row slices, no copies)."""

    family: str
    start: int
    stop: int
    weight: torch.Tensor
    saturation: torch.Tensor
    neg_saturation: torch.Tensor  # -s, so that -(d + s) costs one pass
    choke: torch.Tensor  # U'(0)
    eta: torch.Tensor | None  # (n, 1), isoelastic only
    slope: torch.Tensor | None  # s / w, quadratic only (inf where w = 0 keeps d at 0)
    neg_slope: torch.Tensor | None  # -s / w with 0 where w = 0, quadratic only

    @staticmethod
    def build(
        family: str, start: int, stop: int, weight: torch.Tensor, saturation: torch.Tensor, eta: torch.Tensor
    ) -> "FamilyBlock":
        w, s = weight[start:stop], saturation[start:stop]
        if family == QUADRATIC:
            slope = s / w
            return FamilyBlock(family, start, stop, w, s, -s, w, None, slope, torch.where(w > 0, -slope, 0.0))
        block_eta = eta[start:stop].unsqueeze(1) if family == ISOELASTIC else None
        return FamilyBlock(family, start, stop, w, s, -s, w / s, block_eta, None, None)


def demand_into(block: FamilyBlock, y: torch.Tensor, out: torch.Tensor) -> None:
    """Write g(y) clamped at 0 into ``out`` (same shape as y)."""
    if block.family == LOG:
        torch.addcdiv(block.neg_saturation, block.weight, y, out=out)  # w / y - s
    elif block.family == ISOELASTIC:
        torch.div(block.choke, y, out=out)
        out.pow_(1.0 / block.eta).sub_(1.0).mul_(block.saturation)
    else:
        # s - (s/w) y; rows with w = 0 give -inf here (s/w = inf, y > 0), which the clamp maps to 0
        torch.addcmul(block.saturation, block.slope, y, value=-1.0, out=out)
    out.clamp_(min=0.0)


def slope_into(block: FamilyBlock, y: torch.Tensor, d: torch.Tensor, out: torch.Tensor) -> None:
    """Write g'(y) where d > 0, else 0 (always <= 0). sign(d) is the activity indicator, since
    d >= 0: for log/isoelastic g' = -(d + s)/(eta y) = -(d + s sign(d))/(eta y) on the active set."""
    torch.sign(d, out=out)
    if block.family == QUADRATIC:
        out.mul_(block.neg_slope)
        return
    out.mul_(block.neg_saturation).sub_(d).div_(y)
    if block.family == ISOELASTIC:
        out.div_(block.eta)


def curvature_into(block: FamilyBlock, y: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor) -> None:
    """Write g''(y) (0 where inactive, as gamma is); g'' = -c g'/y with a family constant c."""
    if block.family == QUADRATIC:
        out.zero_()
    elif block.family == LOG:
        torch.div(gamma, y, out=out).mul_(-2.0)
    else:
        torch.div(gamma, y, out=out).mul_(-(1.0 + block.eta) / block.eta)


def marginal_utility_into(block: FamilyBlock, d: torch.Tensor, out: torch.Tensor) -> None:
    """Write U'(d), computed from d directly (used to certify the followers' KKT conditions)."""
    if block.family == LOG:
        torch.add(block.saturation, d, out=out)
        torch.div(block.weight, out, out=out)
    elif block.family == ISOELASTIC:
        torch.div(d, block.saturation, out=out)
        out.add_(1.0).pow_(-block.eta).mul_(block.choke)
    else:
        torch.div(d, block.saturation, out=out)
        out.neg_().add_(1.0).mul_(block.weight)


def utility(block: FamilyBlock, d: torch.Tensor) -> torch.Tensor:
    """U_j(d_j) summed over resources, one value per tenant of the block."""
    w, s = block.weight, block.saturation
    if block.family == LOG:
        values = w * torch.log1p(d / s)
    elif block.family == ISOELASTIC:
        eta = block.eta
        near_log = (eta - 1.0).abs() < 1e-12
        power = (torch.pow(1.0 + d / s, 1.0 - eta) - 1.0) / torch.where(near_log, 1.0, 1.0 - eta)
        values = w * torch.where(near_log, torch.log1p(d / s), power)
    else:
        values = w * (d - d * d / (2.0 * s))
    return values.sum(dim=1)
