"""The global phase's screen: one-price line searches through a local optimum.

Once budgets bind, the profit is not concave: a tenant's budget multiplier couples every
resource it buys, and the profit along one price typically has several humps (budgets binding
on one, slack on the other). A local optimum certifies that no small move helps; this screen
looks far along each price line for another hump that beats it:

1. every free price r is moved over a log grid spanning its whole feasible range, the other
   prices held (band-aware: the range keeps the pool's band; a guaranteed price also moves
   with the drainable prices of its pool at their ratio, a second line);
2. the best other local maximum of each line's profile, if within ``margin`` of the
   incumbent, is refined by bracket halving (the most promising lines, a few rounds);
3. the first candidate whose profit beats the incumbent is returned: the leader restarts there.

All candidates are evaluated in one follower solve per round (``batch_eval``), on a tenant
sample, and only for the tenants who can buy a moved resource: the others' best response
does not depend on it, so their demand is the incumbent's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from market_pipeline.market.batch_eval import stacked_demand
from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.followers import FollowerState, solve_followers
from market_pipeline.market.population import DevicePopulation

CHUNK_ROWS = 4096  # (tenant, candidate) rows per follower solve of the screen
CAPACITY_SLACK = 1e-9  # relative: a candidate may not oversell more than the incumbent does


@dataclass(frozen=True)
class LineSearchResult:
    prices: np.ndarray | None  # a candidate beating the incumbent on the sample, or None
    gain: float  # its profit over the incumbent's on the sample, relative (0 when none)
    screened: int  # price vectors evaluated


class Screen:
    """Profit and capacity feasibility of candidate prices on ``pop`` (a tenant sample),
    relative to an incumbent price vector."""

    def __init__(
        self,
        pop: DevicePopulation,
        unit_cost: np.ndarray,
        capacity: np.ndarray,
        incumbent: np.ndarray,
        tol: float,
        state: FollowerState | None = None,
    ) -> None:
        """``state``: the followers of ``pop`` at ``incumbent`` when already solved. Scratch
        buffers come from ``pop``'s workspace (the solve's own: no memory beyond it once the
        population has more rows than a chunk)."""
        self.pop, self.tol = pop, tol
        self.workspace = pop.workspace
        self.unit_cost, self.capacity = unit_cost, capacity
        self.incumbent = np.asarray(incumbent, dtype=np.float64)
        p = torch.as_tensor(self.incumbent, device=pop.device)
        base = state if state is not None else solve_followers(pop.using(self.workspace), p, tol=tol)
        mult = pop.multiplicity
        self.rows_demand = base.demand if mult is None else base.demand * mult.unsqueeze(1)
        self.demand = self.rows_demand.sum(dim=0).cpu().numpy()
        self.profit = float((self.incumbent - unit_cost) @ self.demand)
        capped = np.isfinite(capacity)
        self.allowed_excess = np.where(
            capped,
            np.maximum(self.demand - np.where(capped, capacity, 0.0), 0.0)
            + CAPACITY_SLACK * np.where(capped, np.maximum(capacity, 1.0), 0.0),
            np.inf,
        )
        self.buyers = (pop.entry_price > 0).to(pop.budget.dtype)  # (N, M): who can buy r at any price
        self.evaluated = 0

    def evaluate(self, candidates: np.ndarray) -> np.ndarray:
        """(K,) profit at each row of ``candidates``, -inf where it oversells capacity more
        than the incumbent does."""
        k, m = candidates.shape
        self.evaluated += k
        changed = np.abs(candidates - self.incumbent) > 1e-15 * np.maximum(self.incumbent, 1.0)
        moved = torch.as_tensor(changed.T.astype(np.float64), device=self.pop.device)  # (M, K)
        hits = torch.nonzero((self.buyers @ moved).T > 0)  # (R, 2): candidate, tenant (sorted by candidate)
        delta = torch.zeros((k, m), dtype=self.buyers.dtype, device=self.pop.device)
        prices_all = torch.as_tensor(candidates, device=self.pop.device)
        # (no chunk at all when no sampled tenant can buy a moved resource: nothing changes)
        for chunk in torch.split(hits, CHUNK_ROWS) if hits.shape[0] else ():  # bounded memory
            which, tenant = chunk[:, 0], chunk[:, 1]
            # no multiplier guess from the incumbent: far along a line it is a poor one, and the
            # iteration from a = 1 settles every row in a few steps
            demand, _ = stacked_demand(self.pop, tenant, prices_all[which], self.workspace, tol=self.tol)
            delta.index_add_(0, which, demand - self.rows_demand[tenant])
        total = self.demand + delta.cpu().numpy()
        profit = ((candidates - self.unit_cost) * total).sum(axis=1)
        excess = total - np.where(np.isfinite(self.capacity), self.capacity, np.inf)
        feasible = np.all(excess <= self.allowed_excess, axis=1)
        return np.where(feasible, profit, -np.inf)


@dataclass
class _Line:
    resource: int
    partners: list[tuple[int, float]]  # (drainable index, price ratio to r) moving with r
    low: float  # log price range
    high: float

    def prices(self, incumbent: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out = np.repeat(incumbent[None, :], positions.size, axis=0)
        x = np.exp(positions)
        out[:, self.resource] = x
        for d, ratio in self.partners:
            out[:, d] = ratio * x
        return out


def build_lines(incumbent: np.ndarray, constraints: PriceConstraints) -> list[_Line]:
    """Per free price a line moving it alone, its range cut so that bounds and bands hold; and
    for a guaranteed price with drainable ones in its pool, a line moving the pool together
    (drainable prices at their ratio to it)."""
    lower, upper = constraints.lower, constraints.upper
    pairs = constraints.band_pairs()
    lines = []
    for r in range(incumbent.size):
        low, high = lower[r], upper[r]
        pool_low, pool_high, partners = low, high, []
        for g, d, f_low, f_high in pairs:
            if d == r:  # f_low p_g <= p_d <= f_high p_g
                low, high = max(low, f_low * incumbent[g]), min(high, f_high * incumbent[g])
            elif g == r:
                low, high = max(low, incumbent[d] / f_high), min(high, incumbent[d] / f_low)
                ratio = incumbent[d] / incumbent[r]
                partners.append((d, ratio))
                pool_low, pool_high = max(pool_low, lower[d] / ratio), min(pool_high, upper[d] / ratio)
        if high > low * (1.0 + 1e-9):
            lines.append(_Line(r, [], float(np.log(low)), float(np.log(high))))
        if partners and pool_high > pool_low * (1.0 + 1e-9):
            lines.append(_Line(r, partners, float(np.log(pool_low)), float(np.log(pool_high))))
    return lines


def line_search(
    screen: Screen,
    constraints: PriceConstraints,
    *,
    points: int,
    local_steps: tuple[float, ...],
    refine_rounds: int,
    margin: float,
    refine_lines: int,
    min_gain: float,
    beat: float | None = None,
) -> LineSearchResult:
    """Search the lines through ``screen.incumbent``; a candidate must beat ``beat`` (default
    the incumbent's sampled profit) by ``min_gain`` (relative) to be returned. Each line is
    probed at ``points`` log-spaced prices over its range and at the incumbent's price times
    (1 + s)^(+-1) for s in ``local_steps`` (other humps are often within tens of percent)."""
    incumbent = screen.incumbent
    base = screen.profit if beat is None else beat
    threshold = base + min_gain * abs(base) if np.isfinite(base) else -np.inf
    lines = build_lines(incumbent, constraints)
    offsets = np.log1p(np.asarray(local_steps, dtype=np.float64))
    grids = []
    for line in lines:
        here = float(np.log(incumbent[line.resource]))
        near = np.concatenate([here - offsets, here + offsets])
        far = np.linspace(line.low, line.high, points) if points else np.empty(0)
        grids.append(np.sort(np.concatenate([far, near[(near > line.low) & (near < line.high)]])))
    if sum(g.size for g in grids) == 0:
        return LineSearchResult(None, 0.0, screen.evaluated)
    candidates = np.concatenate([line.prices(incumbent, grid) for line, grid in zip(lines, grids)])
    values = screen.evaluate(candidates)
    found = _winner(candidates, values, threshold, base, screen)
    if found is not None or refine_rounds == 0:
        return found or LineSearchResult(None, 0.0, screen.evaluated)
    splits = np.cumsum([g.size for g in grids])[:-1]
    brackets = _promising(
        lines,
        grids,
        np.split(values, splits),
        incumbent,
        screen.profit,
        screen.profit - margin * abs(screen.profit),
        refine_lines,
    )
    for _ in range(refine_rounds):
        if not brackets:
            break
        trial = [(line, np.array([(b[0] + b[1]) / 2, (b[1] + b[2]) / 2])) for line, b, _ in brackets]
        candidates = np.concatenate([line.prices(incumbent, pos) for line, pos in trial])
        values = screen.evaluate(candidates).reshape(len(trial), 2)
        found = _winner(candidates, values.reshape(-1), threshold, base, screen)
        if found is not None:
            return found
        brackets = [(line, *_halve(b, f, v)) for (line, b, f), v in zip(brackets, values)]
    return LineSearchResult(None, 0.0, screen.evaluated)


def _winner(
    candidates: np.ndarray, values: np.ndarray, threshold: float, base: float, screen: Screen
) -> LineSearchResult | None:
    best = int(np.argmax(values))
    if not (np.isfinite(values[best]) and values[best] > threshold):
        return None
    gain = (values[best] - base) / abs(base) if np.isfinite(base) and base != 0 else float("inf")
    return LineSearchResult(candidates[best].copy(), float(gain), screen.evaluated)


def _promising(lines, grids, values, incumbent, incumbent_value, floor, keep):
    """Per line, its best local maximum other than the incumbent's own hump, as a bracket
    (left, centre, right) in log price with the centre's value; the ``keep`` best above
    ``floor``."""
    found = []
    for line, grid, profile in zip(lines, grids, values):
        here = float(np.log(incumbent[line.resource]))
        positions = np.append(grid, here)
        order = np.argsort(positions, kind="stable")
        pos, val = positions[order], np.append(profile, incumbent_value)[order]
        own = int(np.flatnonzero(order == grid.size)[0])
        best = None
        for i in range(pos.size):
            if i == own or not np.isfinite(val[i]) or val[i] < floor:
                continue
            left = val[i - 1] if i > 0 else -np.inf
            right = val[i + 1] if i + 1 < pos.size else -np.inf
            if val[i] >= left and val[i] >= right and (best is None or val[i] > val[best]):
                best = i
        if best is not None:
            lo = pos[best - 1] if best > 0 else pos[best]
            hi = pos[best + 1] if best + 1 < pos.size else pos[best]
            found.append((line, (lo, pos[best], hi), float(val[best])))
    found.sort(key=lambda item: -item[2])
    return found[:keep]


def _halve(bracket, centre_value, values):
    """The bracket around the best of (left midpoint, centre, right midpoint), half as wide."""
    lo, mid, hi = bracket
    left_mid, right_mid = (lo + mid) / 2, (mid + hi) / 2
    if values[0] > centre_value and values[0] >= values[1]:
        return (lo, left_mid, mid), float(values[0])
    if values[1] > centre_value:
        return (mid, right_mid, hi), float(values[1])
    return (left_mid, mid, right_mid), centre_value
