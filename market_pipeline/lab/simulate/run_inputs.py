"""What every strategy run of one simulation shares: built once, identical for every strategy."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.lab.simulate.arrivals import InitialJobs
from market_pipeline.lab.simulate.inputs import FleetNodes, PodTable
from market_pipeline.lab.simulate.settings import SimulationSettings
from market_pipeline.lab.simulate.tenants import Pool, TenantModel
from market_pipeline.placement.capacity import PodRequest
from market_pipeline.placement.typical import TypicalPods


@dataclass(frozen=True)
class RunInputs:
    """Everything the strategy runs share (built once, identical for every strategy)."""

    config: MarketPipelineConfig
    settings: SimulationSettings
    pods: PodTable
    nodes: FleetNodes
    pools: tuple[Pool, ...]
    model: TenantModel
    requests: tuple[PodRequest, ...]
    typical: TypicalPods
    load_index: np.ndarray  # (warm-up + ticks,) true load index k
    index_history: np.ndarray  # observed index before the window
    floor_demand: np.ndarray  # (T, R) at the lowest reachable prices, k = 1 (the highest over the day)
    initial: InitialJobs
    epoch: dt.datetime
    sla_wait_s: float
    # Per pod: the other pools it fits, nearest list price first (`runner.spill_order`). The
    # trace names no GPU model (no pod has a gpu_spec): a rigid job whose drawn pool is full
    # runs on another model it fits rather than queueing behind a 2-GPU pool.
    spill: tuple[tuple[tuple[int, ...], ...], ...] = ()
    initial_index: float = 1.0  # the load index the snapshot `initial` was drawn at
    claims: TenantModel | None = None  # what a learning strategy prices with (not the tenants)
    base_requested: np.ndarray | None = None  # (2R,) GPUs requested per hour at list prices, index 1
