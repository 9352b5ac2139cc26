"""Property-based tests of the one market tick (hypothesis): over random fleets, loads, histories
and prices in force it never raises on valid input, and every published price keeps the
promises (the max step from the price in force, the guaranteed cap, the drainable band, the
pool's bounds), whatever the solve ended in."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from market_pipeline.config import load_config
from market_pipeline.lab.tick_bench import replay_dump
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick import PoolTickInput, Promises, run_market_tick
from market_pipeline.tick.certificate import BacklogParams
from market_pipeline.tick.live import list_prices, pool_tick_input
from market_pipeline.tick.pricing import build_market_problem, resource_name, solver_settings
from market_pipeline.tick.promises import drainable_window, guaranteed_window

TOL = 1e-7
CONFIG = load_config()
gpus = st.floats(0.0, 4096.0, allow_nan=False)


def assert_promises(pools: list[PoolTickInput], tick, promises: Promises) -> None:
    assert len(tick.pools) == len(pools)
    for p, r in zip(pools, tick.pools):
        assert math.isfinite(r.guaranteed) and r.guaranteed > 0, r
        assert math.isfinite(r.drainable) and r.drainable > 0, r
        g_window = guaranteed_window(p.in_force_guaranteed, p.list_price, p.price_min, p.price_max, promises)
        assert g_window.low * (1 - TOL) <= r.guaranteed <= g_window.high * (1 + TOL), (p, r)
        d_window = drainable_window(
            p.in_force_drainable, r.guaranteed, p.price_min * (1 - promises.discount_max), promises
        )
        assert d_window.low * (1 - TOL) <= r.drainable <= d_window.high * (1 + TOL), (p, r)
        assert r.drainable <= r.guaranteed * (1 - promises.discount_min) * (1 + TOL)
        assert r.guaranteed_reason and r.drainable_reason


@st.composite
def pool_inputs(draw, index: int) -> PoolTickInput:
    list_price = draw(st.floats(0.05, 50.0))
    price_min = list_price * draw(st.floats(0.05, 0.99))
    price_max = list_price * draw(st.floats(1.01, 10.0))
    node_gpus = float(draw(st.sampled_from([1, 2, 4, 8])))
    reachable = node_gpus * draw(st.integers(0, 64))
    serving = min(reachable, node_gpus * draw(st.integers(0, 64)))
    in_force_g = list_price * draw(st.floats(0.2, 3.0))
    return PoolTickInput(
        pool_id=f"pool{index}",
        list_price=list_price,
        price_min=price_min,
        price_max=price_max,
        node_gpus=node_gpus,
        serving_gpus=serving,
        reachable_gpus=reachable,
        demand_gpus=draw(gpus),
        backlog_gpus=draw(gpus),
        forecast_upper_gpus=draw(gpus),
        in_force_guaranteed=in_force_g,
        in_force_drainable=in_force_g * draw(st.floats(0.1, 1.2)),
        forecast_price=draw(st.none() | st.just(in_force_g)),
        backlog=BacklogParams(residual_share=draw(st.floats(0.0, 0.5)), min_margin_gpus=0.25),
        hold_reason=draw(st.none() | st.just("no evidence")),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    count=st.integers(1, 6),
    step=st.floats(0.01, 0.5),
    cap=st.floats(1.0, 1.5),
    band=st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.45)),
)
def test_tick_without_a_market_keeps_every_promise(data, count, step, cap, band) -> None:
    pools = [data.draw(pool_inputs(i)) for i in range(count)]
    promises = Promises(
        max_step=step, guaranteed_cap=cap, discount_min=band[0], discount_max=band[0] + band[1]
    )
    assert_promises(pools, run_market_tick(pools, None, promises), promises)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), resolve=st.booleans(), with_response=st.booleans())
def test_the_live_market_tick_on_random_fleets_and_histories_keeps_every_promise(
    data, resolve, with_response
) -> None:
    """The default market's tenants over a random fleet (GPUs on, pool sizes), load (demand,
    pending, forecast), history (typical demand, or none: a cold start) and prices in force."""
    in_force: dict[str, float] = {}
    serving, fleet_gpus, observed, upper, typical, response = {}, {}, {}, {}, {}, {}
    for pool in CONFIG.pools:
        g_list, d_list = list_prices(CONFIG, pool.pool_id)
        g = g_list * data.draw(st.floats(0.3, 2.0))
        in_force[resource_name(pool.pool_id, GUARANTEED)] = g
        in_force[resource_name(pool.pool_id, DRAINABLE)] = g * data.draw(st.floats(0.3, 0.9))
        fleet = pool.gpus_per_node * data.draw(st.integers(0, 2 * pool.max_nodes))
        fleet_gpus[pool.pool_id] = float(fleet)
        serving[pool.pool_id] = float(
            min(fleet, pool.gpus_per_node * data.draw(st.integers(0, pool.max_nodes)))
        )
        demand = data.draw(st.floats(0.0, 2.0)) * max(fleet, 1.0)
        observed[pool.pool_id] = (demand, demand * data.draw(st.floats(0.0, 1.0)))
        upper[pool.pool_id] = data.draw(st.none() | st.just(demand * 1.2))
        if data.draw(st.booleans()):
            typical[pool.pool_id] = max(demand, 1.0) * data.draw(st.floats(0.2, 3.0))
        for cls in (GUARANTEED, DRAINABLE):
            if with_response:
                response[resource_name(pool.pool_id, cls)] = data.draw(st.floats(0.05, 5.0))
    problem = build_market_problem(CONFIG, serving, {p: d for p, (d, _) in observed.items()}, typical)
    pools = [
        pool_tick_input(
            CONFIG,
            p.pool_id,
            in_force,
            serving_gpus=serving[p.pool_id],
            fleet_gpus=fleet_gpus[p.pool_id],
            observed=observed[p.pool_id],
            forecast_upper=upper[p.pool_id],
            has_evidence=p.pool_id in typical,
        )
        for p in CONFIG.pools
    ]
    promises = Promises.from_config(CONFIG)
    tick = run_market_tick(
        pools, problem.problem, promises, solver_settings(CONFIG), global_resolve=resolve, response=response
    )
    assert tick.status in ("converged", "capacity_infeasible", "fallback")
    if tick.status == "fallback":
        assert tick.report is not None and tick.report.fallback_reason
    assert_promises(pools, tick, promises)
    for p, r in zip(pools, tick.pools):
        if p.hold_reason is not None:  # no evidence: the prices in force, as far as the promises allow
            window = guaranteed_window(
                p.in_force_guaranteed, p.list_price, p.price_min, p.price_max, promises
            )
            assert r.guaranteed == pytest.approx(window.clip(p.in_force_guaranteed)[0] * r.shield_factor)


def test_a_warm_solve_that_falls_back_is_rescued_by_a_cold_resolve() -> None:
    """A tick of `bench ticks` (the default fleet, epoch 2026-11-04T19:00Z, tick 2026-11-16
    23:00) whose warm solve walked a ridge of budget kinks for 500 leader iterations and fell
    back. Solved again cold with the global phase it converges: the tick steps toward that
    optimum inside the promises, certified, and says why."""
    fixture = Path(__file__).parent / "fixtures" / "warm_fallback_tick.json"
    tick = replay_dump(fixture, CONFIG, False)
    assert tick.status == "converged" and tick.report.kkt_residual <= CONFIG.market.solver_tolerance
    promises = Promises.from_config(CONFIG)
    body = json.loads(fixture.read_text())
    for p, r in zip(body["pools"], tick.pools):
        assert "warm solve fell back (no convergence within 500 leader iterations" in r.guaranteed_reason
        assert "a cold re-solve converged" in r.guaranteed_reason
        window = guaranteed_window(
            p["in_force_guaranteed"], p["list_price"], p["price_min"], p["price_max"], promises
        )
        assert window.low * (1 - TOL) <= r.guaranteed <= window.high * (1 + TOL)
