"""Where a cold solve starts: the uncoupled monopoly price of every resource.

With every budget slack (a = 1) a tenant's demand for resource r depends on p_r alone, so
the profit splits into one-dimensional problems max_p (p - c_r) min(D_r(p), C_r). A
log-spaced grid over [price_min, min(price_max, highest entry price)], refined once around
the best point, solves all of them at once for a few tensor passes. Budgets and the
drainable band couple the resources again; the leader's Newton steps take it from there, but
from within a grid cell of the uncoupled optimum rather than from a formula for identical
tenants (measured on seeded 200 x 8 instances: about one leader iteration fewer).
"""

from __future__ import annotations

import numpy as np
import torch

from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.utility import QUADRATIC, demand_into

GRID_POINTS = 16
GRID_ROUNDS = 2
SAMPLE_TENANTS = 2048  # the argmax is a population average: a sample pins it down
GRID_CELLS = 4_000_000  # tenants x resources x grid points evaluated at once, at most (32 MB)


def initial_prices(problem: MarketProblem, sample: int = SAMPLE_TENANTS) -> np.ndarray:
    """Cold-start prices for ``problem`` (in bounds; the band is left to the projection)."""
    tenants = problem.tenants
    sample = min(sample, max(256, GRID_CELLS // (GRID_POINTS * problem.resources.size)))
    if tenants.size > sample:
        tenants = tenants.subsample(sample)
    return uncoupled_monopoly_prices(
        tenants.on("cpu"),
        problem.resources.unit_cost,
        problem.resources.capacity,
        problem.resources.price_min,
        problem.resources.price_max,
    )


def uncoupled_monopoly_prices(
    pop: DevicePopulation,
    unit_cost: np.ndarray,
    capacity: np.ndarray,
    price_min: np.ndarray,
    price_max: np.ndarray,
    *,
    points: int = GRID_POINTS,
    rounds: int = GRID_ROUNDS,
) -> np.ndarray:
    entry = pop.entry_price.amax(dim=0).cpu().numpy()  # above it nobody buys
    wanted = entry > 0
    low = np.maximum(price_min, 1e-12 * np.maximum(price_max, 1.0))
    high = np.maximum(np.minimum(price_max, np.where(wanted, entry, price_max)), low)
    best = low
    for _ in range(rounds):
        grid = low * (high / low) ** np.linspace(0.0, 1.0, points)[:, None]  # (K, M)
        demand = _aggregate_demand_at(pop, grid)
        profit = (grid - unit_cost) * np.minimum(demand, capacity)
        best = grid[profit.argmax(axis=0), np.arange(grid.shape[1])]
        cell = (high / low) ** (1.0 / (points - 1))
        low, high = np.maximum(best / cell, price_min), np.minimum(best * cell, price_max)
    return np.where(wanted, np.clip(best, price_min, price_max), price_min)


def _aggregate_demand_at(pop: DevicePopulation, grid: np.ndarray) -> np.ndarray:
    """(K, M) aggregate demand with slack budgets at each row of ``grid``."""
    prices = torch.as_tensor(grid, dtype=pop.budget.dtype, device=pop.device)
    y = prices.unsqueeze(1).expand(grid.shape[0], pop.size, grid.shape[1])
    y = y + pop.delay_cost if pop.delay_cost is not None else y.contiguous()
    demand = torch.empty_like(y)
    for block in pop.blocks:
        demand_into(block, y[:, block.start : block.stop], demand[:, block.start : block.stop])
    if pop.multiplicity is None:
        return demand.sum(dim=1).cpu().numpy()
    return torch.einsum("knm,n->km", demand, pop.multiplicity).cpu().numpy()


def identical_tenant_prices(problem: MarketProblem, sample: int = 8192) -> np.ndarray:
    """Per resource, the monopoly price sqrt(c * choke) of identical log tenants, with the
    average choke price U'(0) of the tenants who want the resource. The engine's cold start
    before the grid; the SciPy baseline keeps it, as SLSQP needs fewer evaluations from it
    on the benchmark instances (see ``baseline``)."""
    pop, res = problem.tenants, problem.resources
    if pop.size > sample:
        pop = pop.subsample(sample)
    w, s = pop.weight, pop.saturation
    mult = torch.ones(pop.size, dtype=w.dtype) if pop.multiplicity is None else pop.multiplicity
    choke = w / s
    for family, start, stop in pop.family_spans:
        if family == QUADRATIC:
            choke[start:stop] = w[start:stop]
    wanted = (w > 0).to(w.dtype) * s * mult.unsqueeze(1)
    mass = wanted.sum(dim=0)
    mean_choke = torch.where(mass > 0, (wanted * choke).sum(dim=0) / mass.clamp_min(1e-300), 0.0).numpy()
    guess = np.sqrt(np.maximum(res.unit_cost, 0.05 * mean_choke) * mean_choke)
    return np.clip(np.where(mean_choke > 0, guess, res.price_min), res.price_min, res.price_max)
