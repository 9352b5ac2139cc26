"""A job larger than any the pool saw lately (issue 40, item 9: Helios vcMod went from 0 to 64
GPUs after a week below 25), and a trace that starts overloaded (vcpDC)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import numpy as np

from market_pipeline.lab.scaling.fleet_sim import FleetParams
from market_pipeline.lab.scaling.replay import DemandLoad, ReplaySettings, replay_policy
from market_pipeline.scaling.types import ScalingConfig

START = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def _first_big_job(quiet_minutes: int = 600, job_gpus: float = 64.0) -> DemandLoad:
    """8 nodes of 8 GPUs provisioned, a long lull at 0-8 GPUs, then one job of `job_gpus`."""
    demand = np.r_[np.full(quiet_minutes // 2, 8.0), np.zeros(quiet_minutes // 2), np.full(120, job_gpus)]
    return DemandLoad(demand, START, initial_gpus=64, source="synthetic")


def _settings(fraction: float) -> ReplaySettings:
    scaling = replace(ScalingConfig(), warm_reserve_fleet_fraction=fraction, interval_minutes=5.0)
    return ReplaySettings(
        fleet=FleetParams(max_nodes=16, warm_nodes=1, pin_probability=0.0),
        scaling=scaling,
        tick_minutes=5,
        forecast_horizon_minutes=5,
    )


def test_a_first_job_larger_than_the_recent_peak_resumes_warm_nodes():
    """Without the fleet reserve the lull leaves one node in service and a warm pool sized to
    the recent peak: the job lands on cold boots that serve none of the tick, and the
    certificate fails. With three quarters of the pool's nodes kept in service or
    standby (its provisioned 8 of 16 nodes are not enough: resumed nodes serve 80% of the
    tick), the job resumes warm nodes and every tick is certified."""
    load = _first_big_job()
    before = replay_policy(load, _settings(0.0))
    after = replay_policy(load, _settings(0.75))
    assert before["certificate_violations"] >= 1
    assert after["certificate_violations"] == 0
    assert after["standby_gpu_hours"] > before["standby_gpu_hours"]  # the price: standby, not idle
    assert after["idle_gpu_hours"] <= before["idle_gpu_hours"] * 1.05


def test_a_trace_that_starts_overloaded_is_not_scored_as_a_decision():
    """Demand at minute 0 above the trace's own capacity is inherited: the replay starts with
    the nodes that minute needs, so the first tick is not a violation."""
    demand = np.full(60, 85.0)
    load = DemandLoad(demand, START, initial_gpus=56, source="synthetic")
    result = replay_policy(load, _settings(0.0))
    assert result["certificate_violations"] == 0


def test_the_fleet_fraction_is_validated():
    import pytest

    from market_pipeline.scaling.types import ScalingError

    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ScalingError, match="warm_reserve_fleet_fraction"):
            ScalingConfig(warm_reserve_fleet_fraction=bad)
