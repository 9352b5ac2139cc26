"""Build the shared inputs of a run and run every strategy on them (in parallel processes
when more than one core is available: the strategies are independent by construction)."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.lab.simulate.arrivals import initial_population
from market_pipeline.lab.simulate.cluster import pod_requests, typical_pods
from market_pipeline.lab.simulate.engine import RunInputs, StrategyRun
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.inputs import FleetNodes, LoadProfile, PodTable
from market_pipeline.lab.simulate.learning import requested_at_list
from market_pipeline.lab.simulate.metrics import StrategyResult
from market_pipeline.lab.simulate.pricing import (
    PremiumPricing,
    PricingStrategy,
    StaticPricing,
    UtilizationPricing,
)
from market_pipeline.lab.simulate.settings import SimulationSettings, pool_prices
from market_pipeline.lab.simulate.stackelberg import StackelbergPricing, learning_strategy
from market_pipeline.lab.simulate.tenants import (
    Pool,
    best_response,
    build_pools,
    calibrate,
    pod_fits_pool,
    resource_set,
)

HELIOS_EPOCH = dt.datetime(2020, 5, 1, tzinfo=dt.UTC)  # first minute of the Helios Earth files


@dataclass(frozen=True)
class LoadWindow:
    index: np.ndarray  # (warm-up + ticks,) load index k: the trace's demand over its mean
    history: np.ndarray  # the index over the days before the window (NaN in gaps)
    level_gpus: float  # demand at index 1: target utilisation x fleet GPUs
    initial_index: float  # the index the jobs running at the start arrived under


def load_window(load: LoadProfile, settings: SimulationSettings, fleet_gpus: int) -> LoadWindow:
    """The simulated window of the load trace. Its shape over time comes from the trace,
    its level from the target utilisation (as the simulated adapter's workload sizes its
    arrivals). Jobs running at time 0 arrived over the past weeks (the long ones carry the
    GPU-hours), so the initial population is sized by the history's mean index, not by the
    instant at which the window happens to start."""
    if load.step_minutes != settings.tick_minutes:
        raise SimulationInputError(
            f"load {load.source}: step {load.step_minutes} min differs from the tick "
            f"{settings.tick_minutes} min"
        )
    per_day = 1440 // settings.tick_minutes
    start = int(round(settings.load_start_day * per_day)) - settings.warmup_ticks
    index = load.window(start, settings.warmup_ticks + settings.ticks, settings.warmup_ticks)
    history = load.factor()[:start]
    seen = history[~np.isnan(history)]
    initial = float(seen.mean()) if seen.size else float(index[0])
    return LoadWindow(index, history, settings.load_target * fleet_gpus, initial)


def build_inputs(
    config: MarketPipelineConfig,
    settings: SimulationSettings,
    pods: PodTable,
    nodes: FleetNodes,
    load: LoadProfile,
) -> RunInputs:
    """The shared inputs: pools, calibrated tenants, arrival floor and the initial jobs."""
    prices = pool_prices(nodes.model_names(), config, settings.economics)
    pools = build_pools(nodes, prices)
    window = load_window(load, settings, nodes.total_gpus)
    model = calibrate(pods, nodes, pools, window.level_gpus, settings.economics)
    # the claims a learning strategy prices with: the class claims, no spread, no swing, no latent demand
    claims = calibrate(
        pods,
        nodes,
        pools,
        window.level_gpus,
        replace(
            settings.economics,
            elastic_elasticity=settings.claims_elastic[0],
            rigid_elasticity=settings.claims_rigid[0],
            elasticity_spread=0.0,
            elasticity_tod_swing=0.0,
            latent_elastic_ratio=0.0,
        ),
    )
    requests = tuple(pod_requests(pods))
    resources = resource_set(pools)
    floor = best_response(model, resources.price_min)
    if model.hourly:  # the envelope over the day: one candidate stream whose thinning ratio at a
        # given price is the same at every hour (static's list price never serves deferred work)
        floor = np.max([best_response(model, resources.price_min, h) for h in range(24)], axis=0)
    base = requested_at_list(
        claims.base_demand,
        claims.mean_gpu_hours,
        claims.elastic,
        claims.pods_by_cell,
        claims.cell_weights,
        pods.gpus,
    )
    initial = initial_population(model, pods, model.base_demand * window.initial_index, settings.seed)
    sla = settings.rigid_sla_wait_s or config.guardrails.task_drain.max_total_seconds
    epoch = HELIOS_EPOCH + dt.timedelta(
        days=settings.load_start_day - settings.warmup_ticks * settings.tick_minutes / 1440
    )
    return RunInputs(
        config,
        settings,
        pods,
        nodes,
        pools,
        model,
        requests,
        typical_pods(list(requests)),
        window.index,
        window.history,
        floor,
        initial,
        epoch,
        float(sla),
        spill_order(pods, nodes, pools),
        window.initial_index,
        claims,
        base,
    )


def spill_order(
    pods: PodTable, nodes: FleetNodes, pools: tuple[Pool, ...]
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """[pool][pod] -> the other pools the pod fits, nearest list price first (the tenant's
    bill changes least), larger pool first on a tie. Pods that fit the same pools share one
    tuple."""
    fits = np.stack([pod_fits_pool(pods, nodes, pool) for pool in pools], axis=1)  # (P, R)
    price = [p.prices.list_price for p in pools]
    out = []
    for r in range(len(pools)):
        others = sorted(
            (q for q in range(len(pools)) if q != r),
            key=lambda q: (abs(price[q] - price[r]), -pools[q].gpus, q),
        )
        by_pattern: dict[bytes, tuple[int, ...]] = {}
        row = []
        for pattern in fits:
            key = pattern.tobytes()
            if key not in by_pattern:
                by_pattern[key] = tuple(q for q in others if pattern[q])
            row.append(by_pattern[key])
        out.append(tuple(row))
    return tuple(out)


def make_strategy(name: str, inputs: RunInputs) -> PricingStrategy:
    if name == "static":
        return StaticPricing(inputs.pools)
    if name == "utilization":
        return UtilizationPricing(inputs.pools, inputs.settings.economics)
    if name == "premium":  # static plus the guaranteed premium: a yardstick
        return PremiumPricing(inputs.pools)
    if name == "clairvoyant":  # the same tick on the true population, hour by hour
        return StackelbergPricing(
            inputs.model, inputs.pools, inputs.config, inputs.settings, epoch=inputs.epoch, name="clairvoyant"
        )
    if name == "claims":  # the tick on the claims alone: no fit, no experiment
        return StackelbergPricing(
            inputs.claims or inputs.model,
            inputs.pools,
            inputs.config,
            inputs.settings,
            epoch=inputs.epoch,
            name="claims",
        )
    if name == "stackelberg":
        return learning_strategy(inputs)
    raise SimulationInputError(f"unknown strategy {name!r}")


# Strategies that solve the Stackelberg game every tick (the rest post a formula's price).
MARKET_SOLVING = frozenset({"stackelberg", "clairvoyant", "claims"})
# Inputs handed to forked workers without pickling them (set just before the fork).
_SHARED: dict[str, Any] = {}


def _run_one(name: str) -> StrategyResult:
    torch.set_num_threads(1)  # tiny solves: extra threads only contend with the other strategies
    inputs: RunInputs = _SHARED["inputs"]
    counter = _SHARED.get("counter")

    def tick(_: int) -> None:
        if counter is not None:
            with counter.get_lock():
                counter.value += 1

    return StrategyRun(inputs, make_strategy(name, inputs)).run(tick)


def run_strategies(
    inputs: RunInputs,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    side_task: Callable[[], Any] | None = None,
) -> tuple[dict[str, StrategyResult], Any]:
    """Every strategy of the settings on the same inputs, plus `side_task` (the placement
    comparison) in the same worker pool; `progress(done_ticks, total)`. Returns the results
    by strategy and the side task's result (None without one)."""
    names = inputs.settings.strategies
    total = len(names) * inputs.load_index.size
    tasks = len(names) + (side_task is not None)
    workers = min(tasks, workers if workers is not None else (os.cpu_count() or 1))
    if workers <= 1 or "fork" not in mp.get_all_start_methods():
        return _run_serial(inputs, names, total, progress), (side_task() if side_task else None)
    ctx = mp.get_context("fork")
    counter = ctx.Value("i", 0)
    _SHARED.update(inputs=inputs, counter=counter, side_task=side_task)
    try:
        with ctx.Pool(workers) as pool:
            # Longest first (the pool hands tasks out in submission order): a strategy that
            # solves the market each tick takes several times a fixed-price one, so it starts
            # at once while the placement replay and the cheap strategies share the rest.
            solving = [name for name in names if name in MARKET_SOLVING]
            pending = {name: pool.apply_async(_run_one, (name,)) for name in solving}
            side = pool.apply_async(_run_side) if side_task is not None else None
            pending |= {name: pool.apply_async(_run_one, (name,)) for name in names if name not in pending}
            while not all(p.ready() for p in pending.values()):
                time.sleep(0.2)
                if progress is not None:
                    progress(counter.value, total)
            results = {name: pending[name].get() for name in names}
            side_result = side.get() if side is not None else None
    finally:
        _SHARED.clear()
    if progress is not None:
        progress(total, total)
    return results, side_result


def _run_side() -> Any:
    return _SHARED["side_task"]()


def _run_serial(
    inputs: RunInputs, names: tuple[str, ...], total: int, progress: Callable[[int, int], None] | None
) -> dict[str, StrategyResult]:
    results = {}
    done = 0

    def tick(_: int) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    for name in names:
        results[name] = StrategyRun(inputs, make_strategy(name, inputs)).run(tick)
    return results
