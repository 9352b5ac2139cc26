"""A small simulation from the configuration alone (configured pools, the workload's
built-in job shapes, a diurnal load): what the Dagster asset shows before any real-trace
report has been published, and a quick smoke run without ../shared/data."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet.catalog import catalog_from_pools
from market_pipeline.fleet.shapes import builtin_shapes
from market_pipeline.hardware.protocol import NodeState
from market_pipeline.lab.simulate.inputs import FleetNodes, PodTable
from market_pipeline.lab.simulate.settings import PLACEMENT_NAMES, SimulationSettings
from market_pipeline.lab.simulate.simulation import simulate
from market_pipeline.lab.simulate.synthetic import diurnal_load

HISTORY_DAYS = 1.0


def config_fleet(config: MarketPipelineConfig) -> FleetNodes:
    """The configured pools' nodes that start powered on (the fleet catalog's view)."""
    catalog = catalog_from_pools(config)
    on = catalog.nodes
    fleet = FleetNodes.from_catalog(catalog)
    keep = np.array([n.initial_state is NodeState.ON for n in on if n.gpus > 0])
    return FleetNodes(
        tuple(np.asarray(fleet.node_ids)[keep].tolist()),
        tuple(np.asarray(fleet.models)[keep].tolist()),
        fleet.gpus[keep],
        fleet.cpu_milli[keep],
        fleet.mem_mib[keep],
        fleet.specs,
        "config pools",
    )


def small_report(
    config: MarketPipelineConfig,
    days: float = 1.0,
    seed: int = 0,
    shapes: int = 2000,
    workers: int | None = 1,
) -> dict[str, Any]:
    pods = PodTable.from_shapes(builtin_shapes(np.random.default_rng([seed, 11]), shapes))
    settings = SimulationSettings(days=days, seed=seed, load_start_day=HISTORY_DAYS)
    load = diurnal_load(int(math.ceil(HISTORY_DAYS + days)) + 1, settings.tick_minutes, seed=seed)
    return simulate(
        config,
        settings,
        pods,
        config_fleet(config),
        load,
        placement=PLACEMENT_NAMES,
        workers=workers,
        sources={"pods": "built-in shapes", "load": load.source},
    )
