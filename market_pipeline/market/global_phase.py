"""The leader's global phase: several local solves, the best certified one kept.

KKT conditions certify a local optimum only, and with binding budgets the leader's problem
has several (each tenant's budget multiplier couples every resource it buys). A cold solve
therefore runs:

1. the local solve from the cold start (``cold_start``), as before;
2. a screen from the best certified optimum so far: one-price line searches on a tenant sample
   (``line_search``), near the optimum's prices and, when the local solve met kinks (more than
   ``global_full_after`` leader iterations) or a restart found another optimum, over each
   price's whole feasible range;
3. where the screen finds prices that beat the optimum, a leader restart from them;

and repeats 2-3 (``SolverSettings.global_restarts`` restarts at most) until the screen finds
nothing better. A start that fails or does not certify is kept out of the comparison, never
fatal: when the first start fails, the screen searches from its best feasible point (or its
start) for any feasible prices to restart from.

``SearchOutcome.summary`` says how sure the result is: starts, distinct certified optima
(prices more than ``distinct_tolerance`` apart) and the best other optimum's profit gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from market_pipeline.market.errors import SolverError
from market_pipeline.market.leader import LeaderResult
from market_pipeline.market.leader_point import LeaderContext, time_left
from market_pipeline.market.line_search import Screen, line_search
from market_pipeline.market.population import DevicePopulation

SOLVE_ERRORS = (SolverError, FloatingPointError, np.linalg.LinAlgError, RuntimeError)


@dataclass(frozen=True, eq=False)
class Attempt:
    """One local solve, with its certificate read right away (the next start reuses the
    workspace that holds this one's follower state)."""

    start: np.ndarray
    result: LeaderResult | None
    certified: bool
    follower_kkt: float
    bound: int  # budget-bound tenants at the solution
    reason: str | None  # why it did not certify

    @property
    def profit(self) -> float:
        return self.result.point.profit if self.result is not None else -np.inf

    @property
    def iterations(self) -> int:
        return self.result.iterations if self.result is not None else 0


@dataclass(frozen=True)
class SearchSummary:
    starts: int
    distinct_optima: int
    alternative_gap: float | None
    screened: int


@dataclass(frozen=True, eq=False)
class SearchOutcome:
    attempts: tuple[Attempt, ...]
    best: Attempt | None  # the most profitable certified attempt
    summary: SearchSummary

    @property
    def iterations(self) -> int:
        return sum(a.iterations for a in self.attempts)

    @property
    def best_feasible(self):
        """The most profitable capacity-feasible point any attempt visited (or None)."""
        points = [
            a.result.best_feasible
            for a in self.attempts
            if a.result is not None and a.result.best_feasible is not None
        ]
        return max(points, key=lambda p: p.profit, default=None)


Runner = Callable[[np.ndarray], LeaderResult]
Certifier = Callable[[LeaderResult], tuple[bool, float, int, str | None]]


def attempt(start: np.ndarray, run: Runner, certify: Certifier) -> Attempt:
    try:
        result = run(start)
    except SOLVE_ERRORS as exc:
        return Attempt(start, None, False, float("inf"), 0, f"{type(exc).__name__}: {exc}")
    try:
        certified, follower_kkt, bound, reason = certify(result)
    except SOLVE_ERRORS as exc:
        certified, follower_kkt, bound, reason = False, float("inf"), 0, f"{type(exc).__name__}: {exc}"
    return Attempt(start, result, certified, follower_kkt, bound, reason)


def _rank(a: Attempt) -> tuple[bool, float]:
    """Converged solutions before capacity-infeasible verdicts, then by profit."""
    return (bool(a.result.converged), a.profit)


def _best(attempts: list[Attempt]) -> Attempt | None:
    return max((a for a in attempts if a.certified), key=_rank, default=None)


def global_search(
    ctx: LeaderContext,
    start: np.ndarray,
    run: Runner,
    certify: Certifier,
    screen_pop: DevicePopulation | None,
    extra_starts: tuple[np.ndarray, ...] = (),
) -> SearchOutcome:
    """The local solves from ``start`` and ``extra_starts``, then screens and restarts while
    they find better optima (``ctx.settings``: global_*). ``screen_pop``: the tenant sample
    screened (None: no global phase)."""
    settings = ctx.settings
    attempts = [attempt(s, run, certify) for s in (start, *extra_starts)]
    screened = 0
    first = len(attempts)
    while (
        screen_pop is not None
        and settings.global_phase
        and len(attempts) - first < settings.global_restarts
        and time_left(ctx)
    ):
        incumbent = _best(attempts)
        # A local solve that took a few Newton steps met a smooth landscape on its way: probe
        # near its optimum only. Kinks (budgets switching) cost iterations: then search far too.
        full = (
            incumbent is None or attempts[0].iterations > settings.global_full_after or len(attempts) > first
        )
        try:
            found, evaluated = _screen(ctx, attempts, incumbent, screen_pop, full)
        except SOLVE_ERRORS:  # a failed screen only ends the search: the starts so far stand
            break
        screened += evaluated
        if found is None:
            break
        attempts.append(attempt(found, run, certify))
        if _best(attempts) is incumbent:  # the restart found nothing better: stop here
            break
    return SearchOutcome(
        tuple(attempts), _best(attempts), _summary(attempts, screened, settings.distinct_tolerance)
    )


def _screen(
    ctx: LeaderContext,
    attempts: list[Attempt],
    incumbent: Attempt | None,
    screen_pop: DevicePopulation,
    full: bool,
) -> tuple[np.ndarray | None, int]:
    """Prices to restart from (or None), and how many price vectors the screen evaluated."""
    settings = ctx.settings
    state = None
    if incumbent is not None:
        prices, beat = incumbent.result.point.prices, None
        if incumbent is attempts[-1] and screen_pop is ctx.pop:  # its followers are still in the workspace
            state = incumbent.result.point.state
    else:  # nothing certified yet: any feasible prices are a better place to start again
        visited = [
            a.result.best_feasible
            for a in attempts
            if a.result is not None and a.result.best_feasible is not None
        ]
        prices, beat = (visited[0].prices if visited else attempts[0].start), -np.inf
    screen = Screen(
        screen_pop.using(ctx.pop.workspace),
        ctx.unit_cost,
        ctx.capacity,
        prices,
        settings.follower_tolerance,
        state,
    )
    found = line_search(
        screen,
        ctx.constraints,
        points=settings.global_points if full else 0,
        local_steps=settings.global_local_steps if full else settings.global_light_steps,
        refine_rounds=settings.global_refine_rounds if full else 0,
        margin=settings.global_margin,
        refine_lines=settings.global_refine_lines,
        min_gain=settings.global_min_gain,
        beat=beat,
    )
    return found.prices, screen.evaluated


def _summary(attempts: list[Attempt], screened: int, tolerance: float) -> SearchSummary:
    certified = sorted((a for a in attempts if a.certified), key=_rank, reverse=True)
    optima: list[Attempt] = []
    for a in certified:
        prices = a.result.point.prices
        if all(
            np.max(np.abs(prices - o.result.point.prices) / o.result.point.prices) > tolerance for o in optima
        ):
            optima.append(a)
    gap = None
    if len(optima) > 1:
        best, other = optima[0].profit, optima[1].profit
        gap = float((best - other) / abs(best)) if best != 0 else None
    return SearchSummary(len(attempts), len(optima), gap, screened)
