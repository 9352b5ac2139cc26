"""The simulator's entry points: from trace files, or from tables already in memory."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.lab.simulate.inputs import (
    FleetNodes,
    LoadProfile,
    PodTable,
    load_helios,
    load_nodes,
    load_pods,
)
from market_pipeline.lab.simulate.report import build_report
from market_pipeline.lab.simulate.runner import build_inputs, run_strategies
from market_pipeline.lab.simulate.saturation import (
    PlacementInputs,
    compare_placement,
    experiment_from_files,
    experiment_from_tables,
)
from market_pipeline.lab.simulate.settings import SimulationSettings
from market_pipeline.lab.simulate.synthetic import flat_load


def simulate(
    config: MarketPipelineConfig,
    settings: SimulationSettings,
    pods: PodTable,
    nodes: FleetNodes,
    load: LoadProfile,
    *,
    placement: Sequence[str] = (),
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    sources: dict[str, Any] | None = None,
    experiment: PlacementInputs | None = None,
) -> dict[str, Any]:
    """Run every strategy of `settings` and the placement comparison (on `experiment`, by
    default the fleet and pod tables themselves); return the report."""
    torch.set_num_threads(1)  # the solves are tiny; threads only contend with the event loop
    started = time.perf_counter()
    cpu_started = _cpu_seconds()
    inputs = build_inputs(config, settings, pods, nodes, load)
    built = time.perf_counter()
    if placement and experiment is None:
        experiment = experiment_from_tables(nodes, pods)
    policies = tuple(placement)
    side = (
        (lambda: _timed(lambda: compare_placement(experiment, policies))) if policies and experiment else None
    )
    results, side_result = run_strategies(inputs, workers=workers, progress=progress, side_task=side)
    compared, placement_seconds = side_result if side_result is not None else ({}, 0.0)
    done = time.perf_counter()
    timing = {
        "inputs_seconds": round(built - started, 3),
        "run_seconds": round(done - built, 3),  # strategies and placement replay, in parallel
        "total_seconds": round(done - started, 3),
        "placement_seconds": round(placement_seconds, 3),
        # this process and its finished workers: the machine's other load does not count
        "cpu_seconds": round(_cpu_seconds() - cpu_started, 3),
        "per_strategy_seconds": {n: r.extra.get("wall_seconds") for n, r in results.items()},
        "workers": workers,
        "cpus": os.cpu_count(),
    }
    sources = {"pods": pods.source, "nodes": nodes.source, "load": load.source, **(sources or {})}
    return build_report(inputs, results, compared, timing, sources)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(task: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = task()
    return result, time.perf_counter() - started


def simulate_files(
    config: MarketPipelineConfig,
    settings: SimulationSettings,
    *,
    pods: str,
    nodes: str,
    loads: Sequence[str] = (),
    placement: Sequence[str] = (),
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """As `simulate`, reading an openb pod list, a node list and Helios load files (summed);
    without load files the load index is flat."""
    pod_table = load_pods(pods)
    fleet = load_nodes(nodes, config)
    if loads:
        load = load_helios(list(loads), settings.tick_minutes)
    else:
        days = int(settings.load_start_day + settings.days) + 1
        load = flat_load(days, settings.tick_minutes)
    experiment = experiment_from_files(nodes, pods) if placement else None
    return simulate(
        config,
        settings,
        pod_table,
        fleet,
        load,
        placement=placement,
        workers=workers,
        progress=progress,
        experiment=experiment,
    )
