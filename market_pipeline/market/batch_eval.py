"""Exact best responses at many price vectors in one follower solve.

The follower solver prices every tenant at one shared vector. A change of units turns K
price vectors into one: tenant j facing prices P_k is the same tenant with quantities
measured in units of 1/P_kr (d' = P_kr d, so spend 1 . d' = P_k . d and the budget is
unchanged), facing the shared price 1. In those units every family keeps its form:

    log, isoelastic:  w' = w,        s' = P s,   delay' = delay / P
    quadratic:        w' = w / P,    s' = P s,   delay' = delay / P

(U'(d') = U'(d) / P, so the first-order condition U'(d) = a P + delay is unchanged). One
solve over the stacked (tenant, price vector) rows then gives each row's exact best response
with the engine's own safeguarded Newton iteration, and d = d' / P.

Rows are chosen freely (``tenant_rows``, ``price_rows``): a line search over one price only
needs the tenants who buy that resource (the others' best response does not depend on it).
"""

from __future__ import annotations

import torch

from market_pipeline.market.followers import solve_followers
from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.utility import QUADRATIC, FamilyBlock
from market_pipeline.market.workspace import Workspace


def family_of_rows(pop: DevicePopulation) -> torch.Tensor:
    """(N,) index of each row's family block."""
    codes = torch.empty(pop.size, dtype=torch.int64, device=pop.device)
    for i, block in enumerate(pop.blocks):
        codes[block.start : block.stop] = i
    return codes


def stacked_population(
    pop: DevicePopulation, tenant_rows: torch.Tensor, prices: torch.Tensor, workspace: Workspace
) -> tuple[DevicePopulation, torch.Tensor]:
    """Rows ``tenant_rows`` of ``pop``, row i in the units of ``prices[i]`` (R, M), regrouped
    by family; also returns the permutation applied (stacked row i is input row order[i])."""
    families = family_of_rows(pop)[tenant_rows]
    order = torch.argsort(families, stable=True)
    rows, scale = tenant_rows[order], prices[order]
    counts = torch.bincount(families, minlength=len(pop.blocks)).tolist()
    weight = torch.empty_like(scale)
    saturation = torch.empty_like(scale)
    spans, start = [], 0
    for block, count in zip(pop.blocks, counts):
        if count == 0:
            continue
        stop = start + count
        local = rows[start:stop] - block.start
        w = block.weight.index_select(0, local)
        weight[start:stop] = w / scale[start:stop] if block.family == QUADRATIC else w
        torch.mul(block.saturation.index_select(0, local), scale[start:stop], out=saturation[start:stop])
        spans.append((block.family, start, stop))
        start = stop
    exponent = pop.newton_exponent.index_select(0, rows)
    blocks = tuple(FamilyBlock.build(f, a, b, weight, saturation, exponent) for f, a, b in spans)
    delay = None
    if pop.delay_cost is not None:
        delay = pop.delay_cost.index_select(0, rows).expand(rows.shape[0], scale.shape[1]) / scale
    entry = torch.cat([b.choke for b in blocks])
    if delay is not None:
        entry = entry - delay
    mult = None if pop.multiplicity is None else pop.multiplicity.index_select(0, rows)
    stacked = DevicePopulation(
        pop.device, blocks, pop.budget.index_select(0, rows), mult, delay, entry, exponent, workspace
    )
    return stacked, order


def stacked_demand(
    pop: DevicePopulation,
    tenant_rows: torch.Tensor,
    prices: torch.Tensor,
    workspace: Workspace,
    *,
    scale_guess: torch.Tensor | None = None,
    tol: float = 1e-10,
    max_iterations: int = 80,
) -> tuple[torch.Tensor, float]:
    """(R, M) best response of tenant ``tenant_rows[i]`` at ``prices[i]``, multiplicity
    applied, in input row order; and the followers' budget residual (relative)."""
    stacked, order = stacked_population(pop, tenant_rows, prices, workspace)
    guess = None if scale_guess is None else scale_guess[order]
    state = solve_followers(
        stacked,
        torch.ones(prices.shape[1], dtype=prices.dtype, device=prices.device),
        guess,
        tol=tol,
        max_iterations=max_iterations,
    )
    demand = state.demand / prices[order]
    if stacked.multiplicity is not None:
        demand = demand * stacked.multiplicity.unsqueeze(1)
    out = torch.empty_like(demand)
    out[order] = demand
    return out, state.budget_residual
