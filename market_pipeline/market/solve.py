"""``solve_equilibrium``: the Stackelberg pricing entry point, with its fallback."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from market_pipeline.market.cold_start import initial_prices
from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.errors import InstanceError, SolverError
from market_pipeline.market.followers import follower_kkt_residual, solve_followers
from market_pipeline.market.global_phase import SOLVE_ERRORS, Attempt, SearchSummary, global_search
from market_pipeline.market.leader import LeaderResult, run_leader
from market_pipeline.market.leader_point import LeaderContext, evaluate, local_model
from market_pipeline.market.leader_step import KKTParts, kkt_parts, solve_step
from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import (
    STATUS_CAPACITY_INFEASIBLE,
    STATUS_CONVERGED,
    STATUS_FALLBACK,
    SolveReport,
    SolverSettings,
)
from market_pipeline.market.workspace import Workspace, borrowed

FINE_RADIUS_AFTER_COARSE = 0.05


# pragma: no mutate start (mutation scope: docs/tooling.md)
def resolve_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InstanceError(f"device: {device!r} requested but CUDA is not available (use 'cpu')")
    return dev


@functools.cache
def _blas_controller() -> ThreadpoolController:
    """Scanning the loaded libraries costs milliseconds, so it is done once per process."""
    return ThreadpoolController()


@contextlib.contextmanager
def compute_threads(settings: SolverSettings) -> Iterator[None]:
    """Thread settings for one solve (restored afterwards); see ``SolverSettings.threads``."""
    wanted = settings.threads
    previous = torch.get_num_threads()
    with _blas_controller().limit(limits=1, user_api="blas"), torch.inference_mode():
        if wanted is not None:
            torch.set_num_threads(wanted)
        try:
            yield
        finally:
            torch.set_num_threads(previous)


def demand_at(problem: MarketProblem, prices: np.ndarray) -> np.ndarray:
    """Aggregate best-response demand per resource at ``prices`` (resource order): what the
    tenants would buy if the platform posted them, e.g. to calibrate the population to the
    load observed at known prices."""
    per_tenant = tenant_demand_at(problem, prices)
    mult = problem.tenants.multiplicity
    return per_tenant.sum(axis=0) if mult is None else mult.numpy() @ per_tenant


def tenant_demand_at(problem: MarketProblem, prices: np.ndarray) -> np.ndarray:
    """(N, R) each tenant row's best response at ``prices`` (one row of a multiplicity stands
    for each of its identical tenants)."""
    prices = np.asarray(prices, dtype=np.float64)
    if prices.shape != (problem.resources.size,) or not np.all(np.isfinite(prices)) or np.any(prices <= 0):
        raise InstanceError(
            f"demand_at: need {problem.resources.size} finite positive prices, got {prices!r}"
        )
    with (
        compute_threads(SolverSettings()),
        borrowed(problem.resources.size, torch.device("cpu")) as workspace,
    ):
        pop = problem.tenants.on("cpu").using(workspace)
        state = solve_followers(pop, torch.as_tensor(prices))
        return state.demand.cpu().numpy().copy()


def escape_plateau(
    pop: DevicePopulation, unit_cost: np.ndarray, constraints: PriceConstraints, start: np.ndarray
) -> np.ndarray:
    """Prices above every tenant's entry price sell nothing and have a zero profit gradient
    (a flat plateau that would pass as stationary): start such resources at half their entry
    price instead, as far as the bounds and the per-tick step allow."""
    entry = pop.entry_price.amax(dim=0).cpu().numpy()  # the highest price anyone buys at (a = 1)
    dead = (start >= entry) & (entry > 0)
    if not dead.any():
        return start
    moved = np.where(dead, np.maximum(0.5 * entry, unit_cost), start)
    return constraints.project(np.minimum(moved, start))


# pragma: no mutate end


def solve_equilibrium(
    problem: MarketProblem,
    *,
    last_prices: np.ndarray | None = None,
    max_step: float | np.ndarray | None = None,
    settings: SolverSettings | None = None,
    device: str = "cpu",
    extra_starts: Sequence[np.ndarray] = (),
) -> SolveReport:
    """Equilibrium prices for ``problem``.

    ``last_prices`` (resource order) warm-starts the solve and is the fallback; ``max_step``
    bounds the move per tick relative to them (0.25 = 25%). Without them the solve is cold and
    runs the global phase (``global_phase``, unless ``settings.global_phase`` is off), with
    ``extra_starts`` (price vectors) as further starts. Invalid arguments raise
    ``InstanceError``; a failed solve never raises: it returns the fallback prices with
    ``status="fallback"``, ``converged=False`` and ``fallback_reason`` set."""
    started = time.perf_counter()
    settings = settings or SolverSettings()
    dev = resolve_device(device)
    if extra_starts and last_prices is not None:
        raise InstanceError("extra_starts: only for cold solves (without last_prices)")
    with compute_threads(settings), borrowed(problem.resources.size, dev) as workspace:
        return _solve(problem, last_prices, max_step, settings, dev, workspace, started, tuple(extra_starts))


def _solve(
    problem: MarketProblem,
    last_prices,
    max_step,
    settings: SolverSettings,
    dev: torch.device,
    workspace: Workspace,
    started: float,
    extra_starts: tuple = (),
) -> SolveReport:
    resources = problem.resources
    constraints = PriceConstraints.build(resources, last_prices, max_step)
    deadline = started + settings.time_budget_s if settings.time_budget_s is not None else None
    ctx = LeaderContext(
        problem.tenants.on(dev).using(workspace),
        constraints,
        resources.unit_cost,
        resources.capacity,
        settings,
        deadline,
    )
    cold = last_prices is None
    try:
        start = constraints.project(initial_prices(problem) if cold else np.asarray(last_prices))
        start = escape_plateau(ctx.pop, resources.unit_cost, constraints, start)
        extra = tuple(
            escape_plateau(
                ctx.pop,
                resources.unit_cost,
                constraints,
                constraints.project(np.asarray(s, dtype=np.float64)),
            )
            for s in extra_starts
        )
    except SOLVE_ERRORS as exc:
        return _fallback(problem, ctx, last_prices, f"{type(exc).__name__}: {exc}", 0, None, None, started)
    screen = _screen_population(problem, ctx) if cold and settings.global_phase else None
    coarse_iterations, summary = 0, None
    if cold and problem.tenants.size > max(settings.coarse_threshold, settings.coarse_tenants):
        start, warm, coarse_iterations, summary = _coarse_start(problem, ctx, start, screen, extra)
        extra = ()
        run = functools.partial(
            run_leader,
            ctx,
            tolerance=settings.tolerance,
            cold=True,
            max_iterations=max(settings.max_iterations - coarse_iterations, 1),
            **warm,
        )
        screen = None  # the global phase ran on the subsample
    else:
        run = functools.partial(
            run_leader, ctx, tolerance=settings.tolerance, max_iterations=settings.max_iterations, cold=cold
        )
    outcome = global_search(ctx, start, run, functools.partial(_certify, ctx), screen, extra)
    summary = summary or outcome.summary
    iterations = coarse_iterations + outcome.iterations
    best = outcome.best
    if best is not None:
        return _report(problem, ctx, best, iterations, summary, started)
    reason = outcome.attempts[0].reason or "solver failed"
    return _fallback(problem, ctx, last_prices, reason, iterations, outcome.best_feasible, summary, started)


# pragma: no mutate start (mutation scope: docs/tooling.md)
def _screen_population(problem: MarketProblem, ctx: LeaderContext) -> DevicePopulation:
    """The tenants the global phase's line searches run on: all of them, or a subsample."""
    settings = ctx.settings
    if problem.tenants.size <= settings.global_sample:
        return ctx.pop
    return problem.tenants.subsample(settings.global_sample, settings.seed + 1).on(ctx.device)


# pragma: no mutate end


def _certify(ctx: LeaderContext, result: LeaderResult) -> tuple[bool, float, int, str | None]:
    """A converged (or capacity-infeasible) result whose followers pass the KKT test."""
    if not (result.converged or result.capacity_infeasible):
        return False, float("inf"), 0, result.stop_reason or "solver failed"
    follower_kkt = follower_kkt_residual(ctx.pop, result.point.state)
    bound = int(result.point.state.budget_bound.sum())
    if follower_kkt <= ctx.settings.tolerance:
        return True, follower_kkt, bound, None
    return False, follower_kkt, bound, f"followers' KKT residual {follower_kkt:.2e} above tolerance"


# pragma: no mutate start (mutation scope: docs/tooling.md)
def _coarse_start(
    problem: MarketProblem, ctx: LeaderContext, start: np.ndarray, screen: DevicePopulation, extra: tuple
):
    """Solve on a random subsample (multiplicity-weighted) first, global phase included: a
    cheap, accurate warm start for prices, capacity multipliers and the Lagrangian Hessian of
    the first full step. Returns (start, warm-start keywords, iterations, search summary)."""
    settings = ctx.settings
    sample = problem.tenants.subsample(settings.coarse_tenants, settings.seed)
    coarse = LeaderContext(
        sample.on(ctx.device).using(ctx.pop.workspace),
        ctx.constraints,
        ctx.unit_cost,
        ctx.capacity,
        settings,
        ctx.deadline,
    )
    run = functools.partial(
        run_leader,
        coarse,
        tolerance=settings.coarse_tolerance,
        max_iterations=settings.max_iterations // 2,
        cold=True,
    )
    outcome = global_search(coarse, start, run, _converged, screen, extra)
    ctx.follower_iterations += coarse.follower_iterations
    chosen = outcome.best or outcome.attempts[0]  # an unconverged coarse point still warms the full solve
    if chosen.result is None:
        return start, {}, outcome.iterations, outcome.summary
    result = chosen.result
    warm = {
        "multiplier": result.step.capacity_multiplier,
        "curvature": result.curvature,
        "radius": FINE_RADIUS_AFTER_COARSE,
    }
    return result.point.prices, warm, outcome.iterations, outcome.summary


# pragma: no mutate end


def _converged(result: LeaderResult) -> tuple[bool, float, int, str | None]:
    return result.converged, 0.0, 0, None if result.converged else (result.stop_reason or "solver failed")


def _report(problem, ctx, best: Attempt, iterations: int, summary: SearchSummary, started) -> SolveReport:
    result = best.result
    point = result.point
    status = STATUS_CAPACITY_INFEASIBLE if result.capacity_infeasible else STATUS_CONVERGED
    report = _make_report(
        problem,
        ctx,
        point.prices,
        point.demand,
        result.step.capacity_multiplier,
        result.kkt,
        best.follower_kkt,
        best.bound,
        iterations,
        result.converged,
        status,
        None,
        started,
    )
    return dataclasses.replace(report, nonsmooth=result.nonsmooth, **_summary_fields(summary))


def _summary_fields(summary: SearchSummary | None) -> dict:
    if summary is None:
        return {}
    return {
        "starts": summary.starts,
        "distinct_optima": summary.distinct_optima,
        "alternative_gap": summary.alternative_gap,
        "screened_prices": summary.screened,
    }


def _make_report(
    problem,
    ctx,
    prices,
    demand,
    multiplier,
    kkt: KKTParts,
    follower_kkt,
    bound,
    iterations,
    converged,
    status,
    reason,
    started,
) -> SolveReport:
    res = problem.resources
    served = np.minimum(demand, res.capacity)
    # Demand above capacity even at price_max is what a capacity-infeasible solve proves: its
    # capacity violation is the shortfall, not a residual. It is certified like a solution on
    # stationarity, complementarity and its followers (the violation is reported on its own).
    leader_kkt = (
        max(kkt.stationarity, kkt.complementarity) if status == STATUS_CAPACITY_INFEASIBLE else kkt.total
    )
    profit = float((prices - res.unit_cost) @ served) if np.all(np.isfinite(served)) else float("nan")
    return SolveReport(
        resource_names=res.names,
        prices=np.asarray(prices, dtype=np.float64),
        demand=np.asarray(demand),
        capacity=res.capacity.copy(),
        capacity_price=np.asarray(multiplier, dtype=np.float64),
        profit=profit,
        kkt_residual=max(leader_kkt, follower_kkt),
        follower_kkt=follower_kkt,
        leader_stationarity=kkt.stationarity,
        leader_complementarity=kkt.complementarity,
        capacity_violation=kkt.feasibility,
        iterations=iterations,
        follower_iterations=ctx.follower_iterations,
        seconds=time.perf_counter() - started,
        converged=converged,
        status=status,
        fallback_reason=reason,
        budget_bound_tenants=bound,
        tenants=problem.tenants.size,
        device=str(ctx.device),
    )


def _fallback(problem, ctx, last_prices, reason, iterations, best_feasible, summary, started) -> SolveReport:
    """Last certified prices with the reason, or without them a safe in-bounds price: the most
    profitable capacity-feasible point the failed solve visited, else price_max (projected
    into the bands); diagnostics are evaluated at the prices returned."""
    constraints = ctx.constraints
    if last_prices is not None:
        prices = np.clip(
            np.asarray(last_prices, dtype=np.float64),
            problem.resources.price_min,
            problem.resources.price_max,
        )
    elif best_feasible is not None:
        prices = best_feasible.prices.copy()
    else:
        prices = constraints.upper.copy()
        try:
            prices = constraints.project(prices)
        except SolverError:
            pass
    nan_kkt = KKTParts(float("inf"), float("inf"), float("inf"))
    m = problem.resources.size
    try:
        point = evaluate(ctx, prices)
        follower_kkt = follower_kkt_residual(ctx.pop, point.state)
        demand, bound = point.demand, int(point.state.budget_bound.sum())
        try:
            model, _ = local_model(ctx, point, np.zeros(m))
            step = solve_step(model, constraints, np.full(m, np.inf), 10.0 * float(constraints.upper.max()))
            kkt, multiplier = kkt_parts(model, constraints, step), step.capacity_multiplier
        except (SolverError, np.linalg.LinAlgError, RuntimeError):
            kkt, multiplier = nan_kkt, np.zeros(m)
    except (SolverError, RuntimeError):
        demand, follower_kkt, bound, kkt, multiplier = (
            np.full(m, np.nan),
            float("inf"),
            0,
            nan_kkt,
            np.zeros(m),
        )
    report = _make_report(
        problem,
        ctx,
        prices,
        demand,
        multiplier,
        kkt,
        follower_kkt,
        bound,
        iterations,
        False,
        STATUS_FALLBACK,
        reason,
        started,
    )
    return dataclasses.replace(report, **{**_summary_fields(summary), "distinct_optima": 0})
