"""Follower best response for all tenants at once.

Tenant j solves  max_d U_j(d) - (p + delay_j) . d  s.t.  p . d <= B_j, d >= 0.
With a = 1 + lambda_j (lambda_j the budget multiplier) the KKT conditions give
d_jr = g_jr(a p_r + delay_jr) in closed form (see ``utility``); the budget then fixes a by a
1-D monotone root S_j(a) = p . d_j(a) = B_j, or a = 1 when the budget is slack.

S_j is convex and decreasing in a for every family, so a safeguarded Newton iteration with a
per-tenant bracket converges for all tenants simultaneously. Newton runs in the variable where
S_j is piecewise linear when there is no delay cost (z = a^(-1/eta) for log/isoelastic, z = a
for quadratic), which makes it exact once the active set settles; bisection (geometric) takes
over whenever a step leaves the bracket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from market_pipeline.market.compaction import MIN_ROWS, compact, level_buffers
from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.utility import demand_into, marginal_utility_into, slope_into


@dataclass(frozen=True, eq=False)
class FollowerState:
    """Best responses of all tenants at ``prices`` (rows in population order)."""

    prices: torch.Tensor  # (M,)
    scale: torch.Tensor  # (N,) a = 1 + budget multiplier
    effective_price: torch.Tensor  # (N, M) a p + delay
    demand: torch.Tensor  # (N, M) per tenant row (not multiplied by multiplicity)
    spend: torch.Tensor  # (N,) p . d
    iterations: int
    budget_residual: float  # max over tenants of the relative budget KKT residual

    @property
    def budget_bound(self) -> torch.Tensor:
        return self.scale > 1.0


# pragma: no mutate start (mutation scope: docs/tooling.md)
def effective_prices_into(
    pop: DevicePopulation, scale: torch.Tensor, prices: torch.Tensor, out: torch.Tensor
) -> None:
    if pop.delay_cost is None:
        torch.outer(scale, prices, out=out)
    else:  # delay is (N, 1) or (N, M); one broadcast pass either way
        torch.addcmul(pop.delay_cost, scale.unsqueeze(1), prices.unsqueeze(0), out=out)


def _block_views(pop: DevicePopulation, y: torch.Tensor, d: torch.Tensor) -> list[tuple]:
    """(block, y rows, d rows, slope-buffer rows) per family block, sliced once per solve."""
    out = pop.buffer("follower_slope")
    return [(b, y[b.start : b.stop], d[b.start : b.stop], out[b.start : b.stop]) for b in pop.blocks]


def _demand(
    pop: DevicePopulation, views: list[tuple], scale: torch.Tensor, prices: torch.Tensor, y: torch.Tensor
) -> None:
    effective_prices_into(pop, scale, prices, y)
    for block, y_rows, d_rows, _ in views:
        demand_into(block, y_rows, d_rows)


def _spend_slope(pop: DevicePopulation, views: list[tuple], prices_sq: torch.Tensor) -> torch.Tensor:
    """dS/da = sum_r p_r^2 g'_r (<= 0), in the workspace's scratch buffer."""
    for block, y_rows, d_rows, out_rows in views:
        slope_into(block, y_rows, d_rows, out_rows)
    return pop.buffer("follower_slope") @ prices_sq


def scale_upper_bound(pop: DevicePopulation, prices: torch.Tensor) -> torch.Tensor:
    """The a at which every resource has left the basket (S = 0), at least 1."""
    upper = (pop.entry_price / prices).amax(dim=1)
    return upper.clamp_(min=1.0).mul_(1.0 + 1e-9)


def _newton_candidate(scale, excess, slope_sum, exponent, safe_exponent, curved_rows):
    """Newton step on S(a) - B, taken in z = a^(-1/eta) (eta > 0) or in a (eta = 0). Where
    nothing is active (slope 0) or the z-step leaves z > 0, the result is non-finite and the
    bracket test rejects it."""
    ratio = excess / slope_sum  # a-space Newton decrement; slope_sum < 0 where anything is active
    base = (ratio / (safe_exponent * scale)).add_(1.0).clamp_(min=0.0)
    curved = base.pow_(-exponent).mul_(scale)
    return torch.where(curved_rows, curved, scale - ratio)


def solve_followers(
    pop: DevicePopulation,
    prices: torch.Tensor,
    scale_guess: torch.Tensor | None = None,
    *,
    tol: float = 1e-11,
    max_iterations: int = 80,
    slot: int | None = None,
) -> FollowerState:
    """Candidates per iteration, first one inside the bracket wins: Newton in z from the
    current point (fast); Newton in a from the bracket's low end, where S > B (monotone for
    a convex decreasing S, so it never leaves the bracket); geometric bisection. Settled
    rows drop out of the iteration (see ``compaction``).

    ``slot`` puts the state's (N, M) tensors in that workspace slot (reused by the next solve
    with the same slot); by default they are freshly allocated."""
    n, m = pop.size, prices.shape[0]
    if slot is None:
        full_y = torch.empty((n, m), dtype=prices.dtype, device=prices.device)
        full_d = torch.empty_like(full_y)
    else:
        full_y, full_d = pop.slot(slot)
    upper = scale_upper_bound(pop, prices)
    lower = torch.ones_like(upper)
    low_excess = torch.full_like(upper, torch.nan)  # excess and slope at `lower` once evaluated there
    low_slope = torch.full_like(upper, torch.nan)
    scale = lower.clone() if scale_guess is None else torch.minimum(scale_guess.clamp_min(1.0), upper)
    prices_sq = prices * prices
    rows, index, y, d, level = pop, None, full_y, full_d, 0  # index: full row of each current row
    tol_budget, exponent = tol * pop.budget, pop.newton_exponent
    safe_exponent, curved_rows = exponent.clamp_min(1e-300), exponent > 0
    full_spend, full_scale = None, None
    views = _block_views(rows, y, d)
    iterations = 0
    while True:
        _demand(rows, views, scale, prices, y)
        spend = d @ prices
        excess = spend - rows.budget
        done = (excess.abs() <= tol_budget) | ((scale <= 1.0) & (excess <= 0))
        done |= upper <= lower * (1.0 + 1e-15)  # bracket at rounding level
        finished = iterations >= max_iterations or bool(done.all())
        left = 0 if finished or rows.size < MIN_ROWS else int((~done).sum())
        shrink = left > 0 and 4 * left <= 3 * rows.size
        if index is None:
            full_spend, full_scale = spend, scale
        elif finished or shrink:
            full_y.index_copy_(0, index, y)
            full_d.index_copy_(0, index, d)
            full_spend.index_copy_(0, index, spend)
            full_scale.index_copy_(0, index, scale)
        if finished:
            break
        iterations += 1
        slope_sum = _spend_slope(rows, views, prices_sq)
        over = excess > 0  # scale always lies inside [lower, upper]: it becomes one of the ends
        lower = torch.where(over, scale, lower)
        low_excess = torch.where(over, excess, low_excess)
        low_slope = torch.where(over, slope_sum, low_slope)
        upper = torch.where(over, upper, scale)
        fast = _newton_candidate(scale, excess, slope_sum, exponent, safe_exponent, curved_rows).clamp_(
            min=1.0
        )
        safe = lower - low_excess / low_slope  # NaN until S > B was seen at `lower`
        inside_fast = (fast >= lower) & (fast < upper) & ~((fast == lower) & (lower > 1.0))
        inside_safe = (safe > lower) & (safe < upper)
        candidate = torch.where(inside_fast, fast, torch.where(inside_safe, safe, torch.sqrt(lower * upper)))
        scale = torch.where(done, scale, candidate)
        if shrink:
            keep = torch.nonzero(~done).flatten()
            rows = compact(rows, keep, level)
            index = keep if index is None else index[keep]
            scale, lower, upper, low_excess, low_slope, tol_budget, exponent, safe_exponent, curved_rows = (
                t[keep]
                for t in (
                    scale,
                    lower,
                    upper,
                    low_excess,
                    low_slope,
                    tol_budget,
                    exponent,
                    safe_exponent,
                    curved_rows,
                )
            )
            y, d = level_buffers(pop, level, left)
            views = _block_views(rows, y, d)
            level = 1 - level
    return FollowerState(
        prices,
        full_scale,
        full_y,
        full_d,
        full_spend,
        iterations,
        _budget_residual(full_scale, full_spend, pop.budget),
    )


# pragma: no mutate end


def _budget_residual(scale: torch.Tensor, spend: torch.Tensor, budget: torch.Tensor) -> float:
    finite = torch.isfinite(budget)
    safe_budget = torch.where(finite, budget, 1.0)
    over = torch.where(finite, (spend - budget).clamp_min(0.0) / safe_budget, 0.0)
    slack_gap = torch.where(finite, (scale - 1.0) * (budget - spend).abs() / safe_budget, 0.0)
    return float(torch.maximum(over, slack_gap).max())


def follower_kkt_residual(pop: DevicePopulation, state: FollowerState) -> float:
    """Max over tenants of the relative KKT residual of the best response.

    Stationarity is checked from d itself (U'(d) against the effective price a p + delay:
    equal where d > 0, U'(0) <= price where d = 0), plus budget feasibility and
    complementarity (a - 1) (B - p.d) = 0, all relative (to the effective price, to B)."""
    worst = state.budget_residual
    gap_all, fold_all = pop.buffer("kkt_gap"), pop.buffer("kkt_fold")
    for block in pop.blocks:
        rows = slice(block.start, block.stop)
        if block.stop == block.start:
            continue
        d, y = state.demand[rows], state.effective_price[rows]
        gap, fold = gap_all[rows], fold_all[rows]
        marginal_utility_into(block, d, gap)
        gap.sub_(y)
        # |gap| where d > 0, max(gap, 0) where d = 0: max(gap, -sign(d) gap), as d >= 0
        torch.sign(d, out=fold).mul_(gap).neg_()
        torch.maximum(gap, fold, out=fold).div_(y)
        worst = max(worst, float(fold.max()))
    return worst
