"""Unserved-demand accounting (priced-out demand is pending), the tick cron from the config,
the held-out tuning procedure's pieces, and the shipped defaults under the no-flapping property."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from market_pipeline.config import DEFAULT_CONFIG_PATH, ConfigError, load_config
from market_pipeline.lab.scaling.fleet_sim import Fleet, FleetParams
from market_pipeline.lab.scaling.forecast import CausalQuantileForecaster
from market_pipeline.lab.scaling.replay import (
    DemandLoad,
    PolicyRun,
    ReplayMetrics,
    ReplaySettings,
    replay_baseline,
)
from market_pipeline.lab.scaling.tuning import apply_combo, combos, compare, rank_key, windows
from market_pipeline.scaling.settings import normalised_prices, scaling_config_from_config
from market_pipeline.scaling.types import ScalingConfig
from market_pipeline.tick.certificate import BacklogParams

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def test_minute_record_counts_priced_out_demand_as_pending() -> None:
    fleet = Fleet(FleetParams(max_nodes=4, warm_nodes=0), 2)
    metrics = ReplayMetrics()
    # 100 GPUs wanted; the price kept 80 of them; 70 were served
    metrics.record_minute(fleet, demand=100.0, realized=80.0, served=70.0, price_ratio=1.4)
    assert metrics.priced_out_gpu_minutes == pytest.approx(20.0)
    assert metrics.queued_gpu_minutes == pytest.approx(10.0)
    assert metrics.pending_gpu_minutes == pytest.approx(30.0)  # everything not served
    summary = metrics.summary(fleet)
    assert summary["pending_gpu_minutes"] == pytest.approx(
        summary["queued_gpu_minutes"] + summary["priced_out_gpu_minutes"]
    )


def drive(run: PolicyRun, demand: np.ndarray, tick: int) -> float:
    """The replay loop of `replay_policy`, returning the GPU-minutes actually served."""
    forecaster = CausalQuantileForecaster(tick, 0.9)
    served = 0.0
    for minute, value in enumerate(demand):
        run.fleet.advance(minute)
        if minute % tick == 0:
            observed = float(demand[max(minute - 1, 0)])
            run.tick(minute, observed, forecaster.forecast() if minute else observed)
        served += run.serve(minute, float(value))
        forecaster.observe(float(value))
    return served


def test_demand_the_price_sheds_is_unserved_in_the_replay() -> None:
    # demand beyond what the whole fleet can serve: the shield must price, and what it
    # prices out is demand the trace wanted served
    config = ScalingConfig(backlog=BacklogParams(price_min=0.5, price_max=3.75))
    fleet = FleetParams(max_nodes=4, warm_nodes=0, pin_probability=0.0)
    run = PolicyRun(ReplaySettings(fleet=fleet, scaling=config, tick_minutes=5), 4, T0)
    demand = np.concatenate([np.full(60, 20.0), np.full(120, 40.0)])
    served = drive(run, demand, 5)
    s = run.metrics.summary(run.fleet)
    assert s["priced_out_gpu_minutes"] > 100.0
    assert s["pending_gpu_minutes"] == pytest.approx(
        s["queued_gpu_minutes"] + s["priced_out_gpu_minutes"], abs=0.05
    )
    assert s["pending_gpu_minutes"] == pytest.approx(float(demand.sum()) - served, abs=0.05)


def test_baseline_prices_nothing_out() -> None:
    demand = np.concatenate([np.full(120, 30.0), np.full(120, 70.0)])
    load = DemandLoad(demand, T0, initial_gpus=32, source="step")
    settings_ = ReplaySettings(fleet=FleetParams(max_nodes=12, warm_nodes=0), tick_minutes=5)
    out = replay_baseline(load, settings_)
    assert out["priced_out_gpu_minutes"] == 0.0
    assert out["pending_gpu_minutes"] == out["queued_gpu_minutes"] > 0.0


@pytest.mark.parametrize(("tick", "cron"), [(3, "*/3 * * * *"), (5, "*/5 * * * *"), (60, "0 * * * *")])
def test_tick_cron_follows_loop_tick_minutes(tick: int, cron: str) -> None:
    config = load_config(DEFAULT_CONFIG_PATH, environ={"MP__LOOP__TICK_MINUTES": str(tick)})
    assert config.loop.tick_cron == cron


def test_a_tick_that_does_not_divide_the_hour_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"loop: .*tick_minutes=7 must divide 60"):
        load_config(DEFAULT_CONFIG_PATH, environ={"MP__LOOP__TICK_MINUTES": "7"})


def test_control_loop_schedule_uses_the_configured_tick() -> None:
    from assets.market.schedules import control_loop_schedule_for
    from sensors.definitions import defs

    assert defs.resolve_schedule_def("control_loop_tick").cron_schedule == load_config().loop.tick_cron
    three = load_config(DEFAULT_CONFIG_PATH, environ={"MP__LOOP__TICK_MINUTES": "3"}).loop
    assert control_loop_schedule_for(three).cron_schedule == "*/3 * * * *"


def test_scale_up_persistence_comes_from_the_config() -> None:
    config = load_config(DEFAULT_CONFIG_PATH, environ={"MP__SCALING__SCALE_UP_PERSISTENCE_MINUTES": "7.5"})
    assert scaling_config_from_config(config, config.pools[0].pool_id).scale_up_persistence_minutes == 7.5


def test_windows_split_the_month_at_day_16_and_restart_from_the_trace_capacity() -> None:
    assert windows(44640) == {"tune": (0, 21600), "held_out": (21600, 44640), "full": (0, 44640)}
    with pytest.raises(ValueError, match="split minute"):
        windows(100)
    total = np.arange(10, 20)
    load = DemandLoad(np.arange(10.0), T0, initial_gpus=10, total_gpus=total)
    part = load.window(4, 8)
    assert part.initial_gpus == 14 and list(part.demand) == [4.0, 5.0, 6.0, 7.0]
    assert part.start == T0 + dt.timedelta(minutes=4)
    with pytest.raises(ValueError, match="window"):
        load.window(5, 11)


def test_apply_combo_sets_the_tick_everywhere_it_is_read() -> None:
    out = apply_combo(ReplaySettings(), (("headroom_fraction", 0.05), ("tick_minutes", 3)))
    assert out.tick_minutes == out.forecast_horizon_minutes == 3
    assert out.scaling.interval_minutes == 3.0 and out.scaling.headroom_fraction == 0.05
    assert len(combos({"a": (1, 2), "b": (3, 4, 5)})) == 6


def _policy(idle: float, pending: float, actions: float = 1.0, violations: int = 0) -> dict:
    return {
        "idle_gpu_hours": idle,
        "pending_gpu_minutes": pending,
        "actions_per_day": actions,
        "certificate_violations": violations,
    }


def test_selection_prefers_feasible_then_least_worst_idle_ratio() -> None:
    base = _policy(100.0, 1000.0, 5.0)
    feasible_loose = [compare(_policy(65.0, 900.0), base), compare(_policy(50.0, 900.0), base)]
    feasible_tight = [compare(_policy(60.0, 900.0), base), compare(_policy(60.0, 900.0), base)]
    # lowest idle on one file, but it hides unserved demand above the baseline's
    infeasible = [compare(_policy(10.0, 1001.0), base), compare(_policy(10.0, 900.0), base)]
    assert not infeasible[0]["met"]["pending"]
    keys = [rank_key(pf, (("tick_minutes", 5),), 2.0) for pf in (feasible_loose, feasible_tight, infeasible)]
    assert min(range(3), key=lambda i: keys[i]) == 1


# Per-minute white noise of up to 5% of the level, at any level, on a node boundary or not. Above
# that the policy follows the rarest peaks: of 240 sampled loads, 3 of 56 at 5-7.5% noise, 7 of
# 30 at 7.5-10% and 60 of 72 at 10-15% take more than 8 actions in two days (README, "Known
# limits"); holding the 12-hour peak instead costs vchbv its idle target. The examples are loads
# that flapped before the dead band and the one-tick wait on anticipatory shortfalls (33 and 13).
@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.floats(16.0, 160.0), st.floats(0.0, 0.05))
@example(390, 45.26290342161259, 0.007344837262942444)
@example(0, 16.0, 0.125)
def test_shipped_defaults_do_not_flap_under_a_noisy_level_load(seed: int, level: float, noise: float) -> None:
    config = load_config(DEFAULT_CONFIG_PATH, environ={})
    pool = config.pools[0]
    scaling = scaling_config_from_config(config, pool.pool_id)
    scaling = replace(scaling, backlog=normalised_prices(scaling.backlog, pool.base_price))
    tick = config.loop.tick_minutes
    initial = max(1, math.ceil(level / 8))
    fleet = FleetParams(max_nodes=2 * initial + 6, warm_nodes=1, seed=seed, pin_probability=0.2)
    run = PolicyRun(
        ReplaySettings(fleet=fleet, scaling=scaling, tick_minutes=tick, forecast_horizon_minutes=tick),
        initial,
        T0,
    )
    rng = np.random.default_rng(seed)
    demand = np.clip(np.round(level + rng.normal(0.0, noise * level, 2 * 1440)), 0.0, None)
    drive(run, demand, tick)
    actions = run.metrics.scale_up_events + run.metrics.scale_down_events
    assert actions <= 8, actions  # two days, settling in from the initial size included
    assert run.metrics.certificate_violations == 0
