"""The tick's demand-response step: the tenant population calibrated to the fitted response.

The forecast says how much the tenants buy at the reference prices (the live calibration's:
each pool's list price, drainable at the middle of the band, `tick.pricing`; the simulator's
tenants are calibrated at the list price of both classes and pass that as `level_prices`);
the demand-response fit (`demand_response`, per pool x class) says how that demand answers
the price. Where a resource has a fitted elasticity, the configured claims stop speaking for
its price response: their weight on it is set to zero and one representative isoelastic
tenant takes its demand (`market.utility`: s = d0, eta = 2 / e, w = p0 * s * 2**eta, so that
at the reference price p0 it buys exactly d0, the population's demand there, with local
elasticity e). The reference must be where the level is known: anchored elsewhere, d0 would
carry the claims' own elasticity between the two prices, and a right fit would still give
the wrong curve. The level (the forecast's calibration) is unchanged;
the slope is the data's. Only own-price responses are identified by the experiments, so the
representative has no cross-resource budget coupling. Its budget is the claims': each claim
tenant's budget split over the resources it buys by its spend there at the reference prices,
summed per resource (`claims_budget`), where the fit is above 1. A tenant that runs out of
money below some price keeps running out of it there whatever its elasticity, and a
representative without that limit would read a fitted e > 1 as "revenue grows without bound
as the price falls" and price the class to the bottom of its band. At e <= 1 spend falls with
the price and the budget is left unbounded, as it is where the claims hold no budget for a
resource (`BUDGET_MARGIN`). Resources without a fit keep the claims.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.resources import DRAINABLE
from market_pipeline.market.solve import tenant_demand_at

# The isoelastic family needs e > 0; a rigid class fitted at ~0 is priced as nearly inelastic.
ELASTICITY_FLOOR = 0.02
ELASTICITY_CEILING = 20.0
BUDGET_MARGIN = (
    4.0  # the representative's budget: this times its spend at the top price and lowest demand's price
)


def response_key(pool_id: str, resource_class: str) -> str:
    return f"{pool_id}/{resource_class}"


def reference_prices(list_prices: np.ndarray, classes: tuple[str, ...], mid_discount: float) -> np.ndarray:
    """Per resource, the price the forecast's level is stated at: the list price (drainable:
    the middle of the band below it)."""
    return np.array([p * (1 - mid_discount) if c == DRAINABLE else p for p, c in zip(list_prices, classes)])


def level_anchor(
    list_prices: np.ndarray, classes: tuple[str, ...], mid_discount: float, level_prices: np.ndarray | None
) -> np.ndarray:
    """Where a fitted curve passes through the population's demand: `level_prices` (the
    prices its level is stated at) when the caller knows them, else the live calibration's
    reference prices."""
    if level_prices is not None:
        return np.asarray(level_prices, dtype=np.float64)
    return reference_prices(np.asarray(list_prices, dtype=np.float64), classes, mid_discount)


def calibrated_to_response(
    problem: MarketProblem,
    reference: np.ndarray,
    elasticity: Mapping[str, float],
    observed: Mapping[str, tuple[float, float]] | None = None,
) -> MarketProblem:
    """`problem` with every resource named in `elasticity` (key "<pool>/<class>") answering its
    price with that elasticity at the reference price, at the demand the population buys there.
    `observed` (per key, the low end of the prices the fit observed demand at and the lower
    bound of its elasticity's interval) lifts the representative's budget to the spend the
    data show there (`observed_budget`)."""
    res = problem.resources
    fitted = [
        (r, float(elasticity[response_key(res.pool[r], res.resource_class[r])]))
        for r in range(res.size)
        if response_key(res.pool[r], res.resource_class[r]) in elasticity
    ]
    fitted = [(r, e) for r, e in fitted if np.isfinite(e)]
    if not fitted:
        return problem
    per_tenant = np.maximum(np.nan_to_num(tenant_demand_at(problem, reference)), 0.0)
    mult = problem.tenants.multiplicity
    d0 = per_tenant.sum(axis=0) if mult is None else mult.numpy() @ per_tenant
    fitted = [(r, e) for r, e in fitted if d0[r] > 0]
    if not fitted:
        return problem
    weight = problem.tenants.weight.numpy().copy()
    for r, _ in fitted:
        weight[:, r] = 0.0  # the claims no longer answer this resource's price
    budgets = claims_budget(problem, reference, per_tenant)
    if observed:
        for r, _ in fitted:
            seen = observed.get(response_key(res.pool[r], res.resource_class[r]))
            if seen is not None and np.isfinite(budgets[r]):
                low, e_low = seen
                budgets[r] = max(budgets[r], observed_budget(float(reference[r]), float(d0[r]), e_low, low))
    return MarketProblem(
        res, response_population(res, reference, d0, fitted, problem.tenants, weight, budgets=budgets)
    )


def claims_budget(problem: MarketProblem, reference: np.ndarray, per_tenant: np.ndarray) -> np.ndarray:
    """(R,) the claims' money per resource: each tenant's budget split over the resources by
    its spend there at the reference prices (NaN where no claim tenant buys the resource)."""
    pop = problem.tenants
    spend = per_tenant * reference[None, :]  # (N, R)
    total = spend.sum(axis=1)
    budget = pop.budget.numpy()
    mult = np.ones(pop.size) if pop.multiplicity is None else pop.multiplicity.numpy()
    share = np.divide(spend, total[:, None], out=np.zeros_like(spend), where=total[:, None] > 0)
    money = (mult * np.where(np.isfinite(budget), budget, 0.0)) @ share
    unbounded = (mult * ~np.isfinite(budget)) @ (share > 0)  # a tenant without a limit
    return np.where((money > 0) & (unbounded == 0), money, np.nan)


def observed_budget(reference: float, d0: float, elasticity_low: float, price_low: float) -> float:
    """The spend the data show at the low end of the prices they cover: on the representative's
    curve (`response_population`'s, d(p) = d0 (2 (reference / p)^(e / 2) - 1)) at the
    elasticity's lower bound, at `price_low` (`ResponseFit.price_low`) where that lies below the
    reference; reference x d0 otherwise. A budget below it would contradict what the tenants
    were seen to buy (at the fit's interval level); below `price_low` the data say nothing and
    the claims' budget still binds. At a lower bound <= 1 spend does not grow as the price
    falls: reference x d0 or less."""
    e = min(max(elasticity_low, ELASTICITY_FLOOR), ELASTICITY_CEILING)
    if not (np.isfinite(price_low) and 0 < price_low < reference):
        return reference * d0
    return price_low * d0 * (2.0 * (reference / price_low) ** (e / 2.0) - 1.0)


def response_population(
    res,
    reference: np.ndarray,
    d0: np.ndarray,
    fitted: list[tuple[int, float]],
    base: TenantPopulation | None = None,
    base_weight: np.ndarray | None = None,
    latent_ratio: float = 0.0,
    budgets: np.ndarray | None = None,
) -> TenantPopulation:
    """`base`'s tenants (with `base_weight`) plus one representative isoelastic tenant per
    (resource, elasticity) in `fitted`, buying d0[r] at reference[r] with local elasticity e.
    `latent_ratio` > 0 adds, per drainable representative, a latent twin that buys nothing at
    the reference price and `latent_ratio` x d0 at half of it (the simulator's latent elastic
    demand, `lab.simulate.tenants` step 5), for a hidden truth only: the tick never adds one.
    `budgets[r]` (finite) is the representative's budget; otherwise it never binds."""
    m = res.size
    rows: list[tuple[str, int, float, float, float, float]] = []  # (id, r, eta, s, w, budget)
    for r, e in fitted:
        eta = 2.0 / min(max(e, ELASTICITY_FLOOR), ELASTICITY_CEILING)
        most = d0[r] * 2.0 * (reference[r] / max(float(res.price_min[r]), 1e-9)) ** (1.0 / eta)
        budget = BUDGET_MARGIN * float(res.price_max[r]) * most
        if budgets is not None and np.isfinite(budgets[r]) and e > 1:
            # only where the slope alone would mislead (e > 1: spend grows as the price falls);
            # a nearly vertical curve (e -> 0) against a binding budget also leaves the
            # followers' budget multiplier unresolvable in float64
            budget = max(float(budgets[r]), reference[r] * d0[r])  # it still buys d0 at the reference
        key = response_key(res.pool[r], res.resource_class[r])
        rows.append((f"response:{key}", r, eta, d0[r], reference[r] * d0[r] * 2.0**eta, budget))
        if latent_ratio > 0 and res.resource_class[r] == DRAINABLE:
            size = latent_ratio * d0[r] / (2.0 ** (1.0 / eta) - 1.0)
            rows.append((f"latent:{key}", r, eta, size, reference[r] * size, budget * (1 + latent_ratio)))
    new_w, new_s = np.zeros((len(rows), m)), np.ones((len(rows), m))
    for i, (_, r, _, size, w, _) in enumerate(rows):
        new_s[i, r], new_w[i, r] = size, w
    n = 0 if base is None else base.size
    families = [] if base is None else [f for f, start, stop in base.family_spans for _ in range(start, stop)]
    delay = (
        None
        if base is None or base.delay_cost is None
        else np.vstack([base.delay_cost.numpy(), np.zeros((len(rows), m))])
    )
    mult = (
        None
        if base is None or base.multiplicity is None
        else np.concatenate([base.multiplicity.numpy(), np.ones(len(rows))])
    )
    weight = base.weight.numpy() if base_weight is None and base is not None else base_weight
    return TenantPopulation.build(
        ids=[*(base.ids if base is not None else ()), *(row[0] for row in rows)],
        families=[*families, *(["isoelastic"] * len(rows))],
        weight=np.vstack([weight, new_w]) if n else new_w,
        saturation=np.vstack([base.saturation.numpy(), new_s]) if n else new_s,
        budget=np.concatenate([base.budget.numpy() if n else np.zeros(0), [row[5] for row in rows]]),
        drainable_mask=np.array([c == DRAINABLE for c in res.resource_class]),
        eta=np.concatenate([base.eta.numpy() if n else np.zeros(0), [row[2] for row in rows]]),
        delay_cost=delay,
        multiplicity=mult,
        drain_tolerant=np.concatenate(
            [
                base.drain_tolerant.numpy() if n else np.zeros(0, dtype=bool),
                [res.resource_class[row[1]] == DRAINABLE for row in rows],
            ]
        ),
    )
