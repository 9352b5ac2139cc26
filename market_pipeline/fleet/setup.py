"""Assemble a twin from the typed config: catalog, workload, arrival profile, placement policy.

The `simulated` adapter and the offline simulator both build their fleet here, so the
fleet/workload model lives in one place. Knobs the config does not carry yet are read with
defaults (`adapter.arrival_source`, `adapter.placement_policy`, `adapter.sim_epoch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet.arrivals import arrival_profile
from market_pipeline.fleet.catalog import FleetCatalog, build_catalog
from market_pipeline.fleet.shapes import load_shapes
from market_pipeline.fleet.twin import FleetTwin, TwinParams
from market_pipeline.fleet.workload import STREAM_BUILTIN, WorkloadModel, WorkloadParams
from market_pipeline.placement.policies import PlacementPolicy, make_policy
from market_pipeline.placement.typical import TypicalPods


@dataclass(frozen=True)
class FleetSetup:
    catalog: FleetCatalog
    workload: WorkloadModel
    params: TwinParams
    seed: int
    workload_source: str

    def policy(self, name: str) -> PlacementPolicy:
        """A fresh policy; fragment_aware measures against this workload's shapes."""
        typical = None
        if name == "fragment_aware":
            shapes = self.workload.shapes
            typical = TypicalPods.from_requests(shapes.request(i) for i in range(len(shapes)))
        return make_policy(name, typical)

    def new_twin(self, epoch_ts: int, policy: str = "best_fit") -> FleetTwin:
        return FleetTwin.create(
            self.catalog, self.workload, self.policy(policy), self.params, self.seed, epoch_ts
        )


def build_setup(
    config: MarketPipelineConfig,
    params: TwinParams | None = None,
    workload_params: WorkloadParams | None = None,
) -> FleetSetup:
    seed = config.adapter.seed
    guarantee = config.guardrails.rigid_guarantee
    params = params or TwinParams(
        sample_interval_s=config.loop.sample_interval_seconds,
        hold_max_nodes_share=guarantee.hold_max_nodes_share if guarantee.enabled else 0.0,
        close_to_drainable=guarantee.enabled and guarantee.close_to_drainable,
        reserve_window_s=round(60 * guarantee.forecast_window_minutes) if guarantee.enabled else 0,
        reserve_horizon_s=round(config.guardrails.task_drain.max_total_seconds),
        empty_nodes_kept=guarantee.empty_nodes_kept if guarantee.enabled else 0,
        refill_empty_nodes=guarantee.enabled and guarantee.refill_empty_nodes,
    )
    workload_params = workload_params or WorkloadParams(arrival_source=config.adapter.arrival_source)
    catalog = build_catalog(config)
    source = config.adapter.workload_source
    shapes = load_shapes(source, np.random.default_rng([seed, STREAM_BUILTIN]), config.resolve_path)
    profile = arrival_profile(
        workload_params.arrival_source,
        workload_params.diurnal_amplitude,
        workload_params.peak_hour_utc,
        config.resolve_path,
    )
    workload = WorkloadModel(shapes, catalog, config.tenants, workload_params, profile, seed)
    return FleetSetup(catalog, workload, params, seed, source)


SIMULATED_HISTORY_DAYS = 7


def default_epoch(now: datetime | None = None) -> int:
    """Midnight UTC a week before `now` (wall clock by default), unix seconds: room for the
    demo to simulate several days before it reaches the wall clock."""
    now = now or datetime.now(UTC)
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return int((midnight - timedelta(days=SIMULATED_HISTORY_DAYS)).timestamp())
