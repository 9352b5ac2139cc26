"""One market tick: solve -> promises -> backlog shield -> published prices + capacity target.

The live assets (`equilibrium_prices`, `price_book`, `scaling_plan`), the simulator's
Stackelberg strategy and the `scaling-eval` replay all call `run_market_tick`; there is no
other copy of this chain. The caller brings what it knows (the fleet state, the demand, the
forecast made from its history, the prices in force) and, where tenants are modelled, the
calibrated market; the tick returns the prices to publish and a record of why:

0. where a demand-response fit is given (`response`: elasticity per "<pool>/<class>", from
   `demand_response`), calibrate the tenant population to it (`tick.response`): the
   forecast sets the level, the fit the slope;
1. solve the Stackelberg equilibrium warm-started from the prices in force, the max step
   counted from them and the guaranteed cap as the upper bound (no market modelled, as in
   the scaling replay, whose demand is demand at the list price: the list price);
2. keep the promises (`tick.promises`): the step, the cap, the drainable band, the bounds;
3. shield each pool (`certificate.shield`) at the capacity serving the interval: a
   price inside the promise window that makes the backlog drain, raising both classes alike;
   where none does, the window's top and the pool's capacity target say what must come;
4. the capacity target: the least capacity (a multiple of the node size, at most what the
   pool can reach) that certifies the forecast at the equilibrium price: what scaling sizes to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick.certificate import (
    BacklogParams,
    BacklogState,
    PriceCapacityAction,
    certify,
    min_certified_capacity,
    shield,
)
from market_pipeline.tick.promises import Promises, drainable_window, guaranteed_window

if TYPE_CHECKING:  # the solver (torch) loads only when a market is solved: replays and the CLI need none
    from market_pipeline.market.problem import MarketProblem
    from market_pipeline.market.report import SolveReport, SolverSettings

AS_SOLVED = "as solved"
HOLD_PREFIX = "holding the prices in force"
GPU_DUST = 1e-9  # relative: a GPU count this far below zero is float dust, read as zero
SHIELD_REASON = "backlog shield"  # how a guaranteed reason names the shield's intervention


class MarketTickError(ValueError):
    """An input to the market tick is invalid; the message names it."""


@dataclass(frozen=True)
class PoolTickInput:
    """What the tick knows about one pool (GPUs, prices per GPU-hour)."""

    pool_id: str
    list_price: float
    price_min: float
    price_max: float
    node_gpus: float
    serving_gpus: float  # capacity serving the coming interval
    reachable_gpus: float  # the most capacity scaling can bring (every node of the pool)
    demand_gpus: float  # running + pending now
    backlog_gpus: float  # pending now
    forecast_upper_gpus: float  # the forecast's upper quantile of demand over the interval
    in_force_guaranteed: float
    in_force_drainable: float
    forecast_price: float | None = None  # guaranteed price the forecast assumed (None: the solver's)
    backlog: BacklogParams = field(default_factory=BacklogParams)
    # Why the pool holds the prices in force instead of the solver's (None: it prices). A pool
    # with no evidence yet (no demand ever observed: a cold start) has nothing to price on.
    hold_reason: str | None = None
    # The share of the guaranteed cap's premium the pool's guarantee backs now
    # (`promises.guarantee_reach`: 1 where no guaranteed work waits).
    guarantee_reach: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.guarantee_reach) and 0.0 <= self.guarantee_reach <= 1.0):
            raise MarketTickError(
                f"pool {self.pool_id}: guarantee_reach must be in [0, 1], got {self.guarantee_reach!r}"
            )
        for name in ("list_price", "in_force_guaranteed", "in_force_drainable", "node_gpus"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise MarketTickError(f"pool {self.pool_id}: {name} must be finite and > 0, got {value!r}")
        if not (math.isfinite(self.price_min) and 0 <= self.price_min < self.price_max):
            raise MarketTickError(
                f"pool {self.pool_id}: need 0 <= price_min < price_max, got "
                f"{self.price_min!r}, {self.price_max!r}"
            )
        gpu_fields = ("serving_gpus", "reachable_gpus", "demand_gpus", "backlog_gpus", "forecast_upper_gpus")
        values = [getattr(self, name) for name in gpu_fields]
        # GPU counts come out of sums and differences of floats: a count a few ulps below zero
        # (-1.1e-16) is zero, not bad input. Dust is relative to the pool's largest count.
        dust = GPU_DUST * max([1.0] + [abs(v) for v in values if math.isfinite(v)])
        for name, value in zip(gpu_fields, values):
            if math.isfinite(value) and -dust <= value < 0:
                object.__setattr__(self, name, 0.0)
            elif not (math.isfinite(value) and value >= 0):
                raise MarketTickError(f"pool {self.pool_id}: {name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class PoolTickRecord:
    """Why a pool's prices are what they are."""

    pool_id: str
    list_price: float
    solver_guaranteed: float
    solver_drainable: float
    guaranteed: float
    drainable: float
    guaranteed_reason: str
    drainable_reason: str
    certified: bool  # the published price certifies the serving capacity
    margin: float  # the certificate's slack (GPUs/min) at the published price, serving capacity
    required_margin: float
    serving_gpus: float
    capacity_target_gpus: float  # least capacity certifying the forecast at the equilibrium price
    equilibrium_price: float  # the solver's guaranteed price inside the promise window
    shield_factor: float = 1.0  # published / equilibrium guaranteed price
    demand_gpus: float = 0.0  # what the tick saw: demand and backlog now, the forecast's upper quantile
    backlog_gpus: float = 0.0
    forecast_upper_gpus: float = 0.0
    reachable_gpus: float = 0.0  # the most capacity scaling can bring: serving it all = exhausted

    @property
    def shielded(self) -> bool:
        """The backlog shield acted: it raised the price, or found no price in the promise
        window that drains the backlog (the window's top is published, uncertified)."""
        return self.shield_factor > 1 + 1e-9 or not self.certified

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class MarketTick:
    status: str  # the solve's status ("converged", "capacity_infeasible", "fallback") or "list"
    converged: bool
    pools: tuple[PoolTickRecord, ...]
    report: SolveReport | None = None

    def prices(self) -> np.ndarray:
        """Published prices in resource order (pool by pool: guaranteed, drainable)."""
        return np.array([v for r in self.pools for v in (r.guaranteed, r.drainable)], dtype=np.float64)

    @property
    def record(self) -> dict[str, object]:
        return {
            "status": self.status,
            "converged": self.converged,
            "pools": [p.to_dict() for p in self.pools],
        }


def run_market_tick(
    pools: list[PoolTickInput] | tuple[PoolTickInput, ...],
    problem: MarketProblem | None,
    promises: Promises,
    solver: SolverSettings | None = None,
    *,
    global_resolve: bool = False,
    switch_threshold: float = 1e-3,
    response: Mapping[str, float] | None = None,
    level_prices: np.ndarray | None = None,
    observed: Mapping[str, tuple[float, float]] | None = None,
) -> MarketTick:
    """One tick over every pool; `problem`'s resources are the pools' (guaranteed, drainable)
    pairs in `pools` order, or None where no market is modelled (the list prices are the
    equilibrium, drainable at the middle of the band).

    `global_resolve` (the live loop's schedule, hourly by default) also solves cold with the
    global phase (`market.resolve`); when that optimum earns `switch_threshold` more profit
    than the warm one, the tick walks toward it within the max step instead.

    `response` (elasticity per "<pool>/<class>", the demand-response fit) calibrates the
    tenants to the fit before the solve (`tick.response`); resources without one keep the claims.
    The fit's curve passes through the demand `problem`'s population buys at `level_prices`,
    the prices its level is stated at: by default the live calibration's reference (the list
    price, drainable at the middle of the band, `tick.pricing`); the simulator's tenants are
    calibrated at the list price of both classes and pass it. `observed` (per key, the low end of
    the prices the fit observed demand at and its elasticity's lower bound,
    `ResponseFit.observed_at`) keeps the representative's budget from contradicting the spend
    the data show there (`tick.response.observed_budget`)."""
    pools = tuple(pools)
    in_force = np.array([v for p in pools for v in (p.in_force_guaranteed, p.in_force_drainable)])
    report: SolveReport | None = None
    note = ""
    if problem is None:
        mid = 1 - promises.band_mid()
        solved = np.array([v for p in pools for v in (p.list_price, p.list_price * mid)])
        status, converged = "list", True
    else:
        from market_pipeline.market.solve import solve_equilibrium

        _check_layout(problem, pools)
        if response:
            from market_pipeline.tick.response import calibrated_to_response, level_anchor

            lists = np.array([p.list_price for p in pools for _ in (GUARANTEED, DRAINABLE)])
            mid = promises.band_mid()
            anchor = level_anchor(lists, problem.resources.resource_class, mid, level_prices)
            problem = calibrated_to_response(problem, anchor, response, observed)
        bounded = _within_promises(problem, pools, promises)
        report = solve_equilibrium(bounded, last_prices=in_force, max_step=promises.max_step, settings=solver)
        solved, status, converged = (
            np.asarray(report.prices, dtype=np.float64),
            report.status,
            report.converged,
        )
        if global_resolve and converged:
            solved, note = _toward_global_optimum(
                bounded, report, in_force, promises, solver, switch_threshold
            )
        elif report.status == "fallback":
            solved, report, note = _cold_rescue(bounded, report, solved, in_force, promises, solver)
            status, converged = report.status, report.converged
    records = tuple(
        _pool_tick(p, float(solved[2 * i]), float(solved[2 * i + 1]), promises, status, note)
        for i, p in enumerate(pools)
    )
    return MarketTick(status, converged, records, report)


def _toward_global_optimum(
    problem: MarketProblem,
    warm: SolveReport,
    in_force: np.ndarray,
    promises: Promises,
    solver: SolverSettings | None,
    threshold: float,
) -> tuple[np.ndarray, str]:
    """The warm prices, or one step toward a cold global optimum worth switching to (and why)."""
    from market_pipeline.market.resolve import global_resolve, relative_gain, step_toward, worth_switching

    fresh = global_resolve(problem, solver, current_prices=in_force)
    gain = relative_gain(fresh.profit, warm.profit)
    if fresh.status != "converged" or not worth_switching(gain, threshold):
        return np.asarray(warm.prices, dtype=np.float64), ""
    res = problem.resources
    moved = step_toward(
        np.asarray(fresh.prices),
        in_force,
        max_step=promises.max_step,
        price_min=res.price_min,
        price_max=res.price_max,
        band_pairs=res.band_pairs,
    )
    return moved, f"global re-solve: another optimum earns {gain:+.2%}; stepping toward it"


def _cold_rescue(
    problem: MarketProblem,
    warm: SolveReport,
    fallback_prices: np.ndarray,
    in_force: np.ndarray,
    promises: Promises,
    solver: SolverSettings | None,
) -> tuple[np.ndarray, SolveReport, str]:
    """A warm solve that fell back (no convergence within the iteration cap: a ridge of budget
    kinks the warm start walks into) is solved again cold, with the global phase and the
    prices in force as one more start. Where that converges (or proves capacity short), the
    tick steps toward its prices inside the promises and its report certifies the tick; else
    the fallback stands (the prices in force) with both reasons."""
    from market_pipeline.market.resolve import global_resolve, step_toward

    fresh = global_resolve(problem, solver, current_prices=in_force)
    if fresh.status == "fallback":
        reason = f"{warm.fallback_reason}; a cold re-solve also fell back: {fresh.fallback_reason}"
        return fallback_prices, replace(warm, fallback_reason=reason), ""
    res = problem.resources
    moved = step_toward(
        np.asarray(fresh.prices),
        in_force,
        max_step=promises.max_step,
        price_min=res.price_min,
        price_max=res.price_max,
        band_pairs=res.band_pairs,
    )
    return moved, fresh, f"warm solve fell back ({warm.fallback_reason}); a cold re-solve {fresh.status}"


def _check_layout(problem: MarketProblem, pools: tuple[PoolTickInput, ...]) -> None:
    classes = problem.resources.resource_class
    if len(classes) != 2 * len(pools) or any(
        classes[2 * i] != GUARANTEED or classes[2 * i + 1] != DRAINABLE for i in range(len(pools))
    ):
        raise MarketTickError(
            "problem: resources must be each pool's (guaranteed, drainable) pair, in pool order"
        )


def _within_promises(
    problem: MarketProblem, pools: tuple[PoolTickInput, ...], promises: Promises
) -> MarketProblem:
    """The problem with the guaranteed cap as its upper price bound (the step goes as max_step)."""
    from market_pipeline.market.problem import MarketProblem

    res = problem.resources
    high = np.array(res.price_max, dtype=np.float64)
    low = np.array(res.price_min, dtype=np.float64)
    for i, p in enumerate(pools):
        reach = p.guarantee_reach
        high[2 * i] = min(high[2 * i], promises.guaranteed_ceiling(p.list_price, p.price_max, reach))
        high[2 * i + 1] = min(high[2 * i + 1], promises.drainable_ceiling(p.list_price, p.price_max, reach))
        low[2 * i] = min(max(low[2 * i], p.price_min), high[2 * i])
        low[2 * i + 1] = min(low[2 * i + 1], high[2 * i + 1])
    return MarketProblem(replace(res, price_min=low, price_max=high), problem.tenants)


def _pool_tick(
    p: PoolTickInput, solver_g: float, solver_d: float, promises: Promises, status: str, note: str = ""
) -> PoolTickRecord:
    window = guaranteed_window(
        p.in_force_guaranteed, p.list_price, p.price_min, p.price_max, promises, p.guarantee_reach
    )
    if p.hold_reason is not None:
        equilibrium, clipped = window.clip(p.in_force_guaranteed)
        solver_d = p.in_force_drainable
        reasons = [f"{HOLD_PREFIX}: {p.hold_reason}"]
    else:
        equilibrium, clipped = window.clip(solver_g)
        reasons = [f"solve {status}"] if status not in ("converged", "list") else []
        reasons += [note] if note else []
    if clipped:
        reasons.append(f"solver price {clipped}")
    params = replace(p.backlog, price_min=window.low, price_max=window.high)
    state = _backlog_state(p, p.forecast_price or equilibrium, p.serving_gpus)
    result = shield(PriceCapacityAction(equilibrium, p.serving_gpus), state, params)
    guaranteed = equilibrium
    if not result.feasible:
        guaranteed = window.high
        reasons.append(
            f"{SHIELD_REASON}: no price up to the {window.high_by} {window.high:.4g} drains the "
            f"backlog at {p.serving_gpus:g} GPUs; {_capacity_answer(p)}"
        )
    elif result.price > equilibrium * (1 + 1e-9):
        guaranteed = result.price
        reasons.append(f"{SHIELD_REASON} x{guaranteed / equilibrium:.3f}: {result.why[-1]}")
    cert = certify(state, guaranteed, p.serving_gpus, params)
    target = _capacity_target(p, equilibrium, params)
    factor = guaranteed / equilibrium
    d_window = drainable_window(
        p.in_force_drainable, guaranteed, promises.drainable_floor(p.price_min), promises
    )
    drainable, d_clipped = d_window.clip(solver_d * factor)
    d_reasons = [f"follows the guaranteed shield x{factor:.3f}"] if factor > 1 + 1e-9 else []
    if d_clipped:
        d_reasons.append(f"price {d_clipped}")
    return PoolTickRecord(
        pool_id=p.pool_id,
        list_price=p.list_price,
        solver_guaranteed=solver_g,
        solver_drainable=solver_d,
        guaranteed=guaranteed,
        drainable=drainable,
        guaranteed_reason="; ".join(reasons) or _as_solved(p, guaranteed),
        drainable_reason="; ".join(d_reasons) or AS_SOLVED,
        certified=cert.admissible,
        margin=cert.margin,
        required_margin=cert.required_margin,
        serving_gpus=p.serving_gpus,
        capacity_target_gpus=target,
        equilibrium_price=equilibrium,
        shield_factor=factor,
        demand_gpus=p.demand_gpus,
        backlog_gpus=p.backlog_gpus,
        forecast_upper_gpus=p.forecast_upper_gpus,
        reachable_gpus=p.reachable_gpus,
    )


def _as_solved(p: PoolTickInput, price: float) -> str:
    """The reason of a price the solver set alone: where it moved, by how much and on what load
    (a price that moves says why)."""
    change = price / p.in_force_guaranteed - 1
    if abs(change) <= 1e-6:
        return AS_SOLVED
    return (
        f"{AS_SOLVED}: {change:+.1%} from {p.in_force_guaranteed:.4g} in force at demand "
        f"{p.demand_gpus:.4g} GPUs (forecast upper {p.forecast_upper_gpus:.4g}) on "
        f"{p.serving_gpus:g} serving"
    )


def _capacity_answer(p: PoolTickInput) -> str:
    """What must answer an uncertified pool: more capacity, or (every node already serving)
    nodes the pool does not have, which only an operator can add."""
    if p.serving_gpus + 1e-9 < p.reachable_gpus:
        return "capacity must come"
    return f"pool exhausted: every node ({p.reachable_gpus:g} GPUs) already serves; add nodes to the pool"


def _backlog_state(p: PoolTickInput, reference_price: float, max_capacity: float) -> BacklogState:
    return BacklogState(
        pool=p.pool_id,
        demand_forecast_gpus=max(p.forecast_upper_gpus, p.demand_gpus),
        reference_price=reference_price,
        backlog_gpus=p.backlog_gpus,
        max_capacity_gpus=max_capacity,
        capacity_step_gpus=p.node_gpus,
    )


def _capacity_target(p: PoolTickInput, equilibrium: float, params: BacklogParams) -> float:
    """Least capacity certifying the forecast at the equilibrium price, within reach."""
    state = _backlog_state(p, p.forecast_price or equilibrium, p.reachable_gpus)
    return float(min(min_certified_capacity(state, equilibrium, params), p.reachable_gpus))
