"""Small instance builders shared by the market tests."""

from __future__ import annotations

import numpy as np

from market_pipeline.market.population import TenantPopulation


def resource(name, capacity=None, unit_cost=1.0, price_min=0.01, price_max=100.0, **extra):
    return {
        "name": name,
        "capacity": capacity,
        "unit_cost": unit_cost,
        "price_min": price_min,
        "price_max": price_max,
        **extra,
    }


def tenant(tid, weight, saturation, budget=None, utility="log", **extra):
    return {
        "id": tid,
        "utility": utility,
        "weight": weight,
        "saturation": saturation,
        "budget": budget,
        **extra,
    }


def mixed_population(
    n: int,
    m: int,
    seed: int,
    *,
    delay: bool = True,
    multiplicity: bool = False,
    drainable_mask: np.ndarray | None = None,
) -> TenantPopulation:
    """All three families, tight budgets for about half of the tenants, some zero weights."""
    rng = np.random.default_rng(seed)
    families = list(rng.choice(["log", "isoelastic", "quadratic"], n))
    return TenantPopulation.build(
        ids=[f"t{j}" for j in range(n)],
        families=families,
        weight=rng.uniform(1.0, 5.0, (n, m)) * (rng.random((n, m)) < 0.8),
        saturation=rng.uniform(0.5, 2.0, (n, m)),
        budget=rng.uniform(0.5, 6.0, n),
        drainable_mask=np.zeros(m, dtype=bool) if drainable_mask is None else drainable_mask,
        eta=rng.uniform(0.3, 2.5, n),
        delay_cost=rng.uniform(0.0, 0.2, (n, m)) if delay else None,
        multiplicity=rng.uniform(0.5, 2.0, n) if multiplicity else None,
    )


def grid_demand(problem, prices: np.ndarray) -> np.ndarray:
    """Aggregate demand at each row of ``prices`` (G, M), computed independently of the engine:
    numpy closed forms and a bisection on every tenant's budget multiplier."""
    pop = problem.tenants
    w, s = pop.weight.numpy()[None], pop.saturation.numpy()[None]
    eta = pop.eta.numpy()[None, :, None]
    delay = 0.0 if pop.delay_cost is None else pop.delay_cost.numpy()[None]
    budget = pop.budget.numpy()[None, :]
    family = np.array(pop.families)[None, :, None]
    p = prices[:, None, :]

    def demand(lam):
        y = (1.0 + lam[..., None]) * p + delay
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log = w / y - s
            iso = s * ((w / s / y) ** (1.0 / eta) - 1.0)
            quad = np.where(w > 0, s * (1.0 - y / np.where(w > 0, w, 1.0)), 0.0)
        d = np.where(family == "log", log, np.where(family == "isoelastic", iso, quad))
        return np.maximum(np.nan_to_num(d, nan=0.0, neginf=0.0), 0.0)

    def spend(lam):
        return (demand(lam) * p).sum(axis=-1)

    zero = np.zeros((prices.shape[0], pop.size))
    low, high = zero.copy(), np.full_like(zero, 1.0)
    while np.any((spend(high) > budget) & np.isfinite(budget)):
        high = np.where(spend(high) > budget, high * 4.0, high)
    bound = spend(zero) > budget
    for _ in range(64):
        mid = 0.5 * (low + high)
        over = spend(mid) > budget
        low, high = np.where(over, mid, low), np.where(over, high, mid)
    lam = np.where(bound, 0.5 * (low + high), 0.0)
    return demand(lam).sum(axis=1)


def grid_profit(problem, prices: np.ndarray, capacity_tol: float = 1e-9) -> np.ndarray:
    """Profit at each row of ``prices``; -inf where guaranteed capacity would be oversold."""
    res = problem.resources
    demand = grid_demand(problem, prices)
    profit = ((prices - res.unit_cost) * np.minimum(demand, res.capacity)).sum(axis=1)
    feasible = np.all(demand <= res.capacity * (1 + capacity_tol), axis=1)
    return np.where(feasible, profit, -np.inf)


def assert_close(actual, expected, rtol: float = 1e-7, atol: float = 1e-12) -> None:
    """torch.testing.assert_close without its multi-second first-call import."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    same = actual == expected  # also matches infinities
    gap = ((actual - expected).abs() - (atol + rtol * expected.abs())).masked_fill(same, 0.0)
    assert bool((gap <= 0).all()), f"max excess {float(gap.max()):.3e} over rtol={rtol}, atol={atol}"
