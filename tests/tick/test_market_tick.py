"""The one market tick: promises, the backlog shield inside them, the capacity target, and a
live market whose price follows the load."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config
from market_pipeline.tick import (
    AS_SOLVED,
    MarketTickError,
    PoolTickInput,
    Promises,
    drainable_window,
    guarantee_reach,
    guaranteed_window,
    run_market_tick,
)
from market_pipeline.tick.certificate import BacklogParams
from market_pipeline.tick.pricing import build_market_problem, solver_settings

PARAMS = BacklogParams(residual_share=0.15, min_margin_gpus=0.25, margin_fraction=0.0)


def pool(**changes) -> PoolTickInput:
    base = dict(
        pool_id="p",
        list_price=2.0,
        price_min=0.8,
        price_max=8.0,
        node_gpus=8.0,
        serving_gpus=64.0,
        reachable_gpus=128.0,
        demand_gpus=40.0,
        backlog_gpus=0.0,
        forecast_upper_gpus=44.0,
        in_force_guaranteed=2.0,
        in_force_drainable=1.2,
        forecast_price=2.0,
        backlog=PARAMS,
    )
    return PoolTickInput(**{**base, **changes})


def short_pool_record(follows_reach: bool = False, **changes):
    """The tick's record of a pool serving 64 GPUs while 90 are wanted and 26 wait, under a
    guaranteed cap of 1.04 x list: no price within the promises certifies it."""
    short = pool(forecast_upper_gpus=90.0, demand_gpus=90.0, backlog_gpus=26.0, **changes)
    promises = Promises(guaranteed_cap=1.04, premium_follows_reach=follows_reach)
    return run_market_tick([short], None, promises).pools[0]


def config_pools(
    config, serving: dict[str, float], *, demand: float, guaranteed_share: float, drainable_share: float
) -> list[PoolTickInput]:
    """Every configured pool serving `serving`, `demand` GPUs wanted, the prices in force at
    the given shares of the list price."""
    return [
        PoolTickInput(
            pool_id=p.pool_id,
            list_price=p.base_price,
            price_min=p.price_min,
            price_max=p.price_max,
            node_gpus=float(p.gpus_per_node),
            serving_gpus=serving[p.pool_id],
            reachable_gpus=float(p.max_nodes * p.gpus_per_node),
            demand_gpus=demand,
            backlog_gpus=0.0,
            forecast_upper_gpus=demand,
            in_force_guaranteed=p.base_price * guaranteed_share,
            in_force_drainable=p.base_price * drainable_share,
            forecast_price=p.base_price,
            backlog=PARAMS,
        )
        for p in config.pools
    ]


def test_window_counts_the_step_from_the_price_in_force_and_caps_against_list() -> None:
    promises = Promises(max_step=0.25, guaranteed_cap=1.04)
    low = guaranteed_window(1.0, 2.0, 0.8, 8.0, promises)
    assert (low.low, low.high, low.high_by) == (0.8, 1.25, "max step")
    at_list = guaranteed_window(2.0, 2.0, 0.8, 8.0, promises)
    assert at_list.high == pytest.approx(2.08) and at_list.high_by == "guaranteed cap"
    # a price in force far above a cap lowered since: the cap wins over the step
    stale = guaranteed_window(9.27, 4.2, 2.0, 14.0, promises)
    assert stale.low == stale.high == pytest.approx(4.368)


def test_a_pool_with_room_publishes_the_list_price_as_solved() -> None:
    record = run_market_tick([pool()], None, Promises()).pools[0]
    assert record.guaranteed == pytest.approx(2.0) and record.guaranteed_reason == AS_SOLVED
    assert record.certified and record.margin >= record.required_margin
    assert record.drainable == pytest.approx(2.0 * 0.6)
    assert record.capacity_target_gpus <= 64.0


def test_the_shield_raises_the_price_inside_the_window_and_reports_it() -> None:
    # 60 GPUs wanted on 64: a price a little above list sheds the margin
    record = run_market_tick(
        [pool(forecast_upper_gpus=63.9, demand_gpus=60.0)], None, Promises(guaranteed_cap=1.5)
    ).pools[0]
    assert 2.0 < record.guaranteed <= 2.0 * 1.25 + 1e-9
    assert record.shielded and record.certified
    assert record.guaranteed_reason.startswith("backlog shield x")
    assert record.drainable_reason.startswith("follows the guaranteed shield")
    assert record.drainable == pytest.approx(1.2 * record.shield_factor)


def test_no_price_within_the_promises_certifies_then_capacity_must_come() -> None:
    record = short_pool_record()
    assert record.guaranteed == pytest.approx(2.08)  # the cap, not the 3x an unbounded shield took
    assert not record.certified and "capacity must come" in record.guaranteed_reason
    assert record.capacity_target_gpus > 90.0 and record.capacity_target_gpus % 8 == 0
    # the shield acted (it found no certifying price): counted as shielded, as its reason says
    assert record.shielded


def test_a_shield_at_the_solvers_own_price_still_counts_as_shielded() -> None:
    """The solver already priced at the cap and no price certifies: the shield's reason is
    published, so the pool counts as shielded though the price did not move."""
    # a price in force above the cap: the window is the cap alone, where the solver's price lands
    record = short_pool_record(in_force_guaranteed=3.0, in_force_drainable=1.8)
    assert record.guaranteed == pytest.approx(2.08) and record.shield_factor == pytest.approx(1.0)
    assert "backlog shield" in record.guaranteed_reason
    assert record.shielded


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(MarketTickError, match="serving_gpus"):
        pool(serving_gpus=float("nan"))
    with pytest.raises(MarketTickError, match="in_force_guaranteed"):
        pool(in_force_guaranteed=0.0)


@pytest.fixture(scope="module")
def config():
    return load_config(DEFAULT_CONFIG_PATH, environ={})


def default_fleet_market(config, expected: float, typical: float | None = None):
    """The default fleet serving every node, and its market problem with every pool expecting
    `expected` GPUs (sized to `typical` when given): (serving by pool, problem)."""
    serving = {p.pool_id: float(p.nodes * p.gpus_per_node) for p in config.pools}
    typical_by_pool = None if typical is None else {p.pool_id: typical for p in config.pools}
    inputs = build_market_problem(
        config, serving, {p.pool_id: expected for p in config.pools}, typical_by_pool
    )
    return serving, inputs.problem


def live_tick(config, expected: float, in_force_share: float = 1.0):
    """The default fleet's tick with every pool expecting `expected` GPUs."""
    serving, problem = default_fleet_market(config, expected)
    pools = config_pools(
        config,
        serving,
        demand=expected,
        guaranteed_share=in_force_share,
        drainable_share=in_force_share * 0.6,
    )
    return run_market_tick(pools, problem, Promises.from_config(config), solver_settings(config))


def test_first_live_solve_keeps_the_step_from_the_base_price_and_the_cap(config) -> None:
    # the round-one bug: H800 went 4.20 -> 9.27 in the first tick at 24% utilisation
    tick = live_tick(config, 6.0)
    assert tick.converged
    for record, p in zip(tick.pools, config.pools):
        assert record.guaranteed <= p.base_price * config.market.guaranteed_price_cap + 1e-9
        assert abs(record.guaranteed / p.base_price - 1) <= config.market.max_price_step + 1e-9
        band = 1 - record.drainable / record.guaranteed
        assert (
            config.market.drainable_discount_min - 1e-9 <= band <= config.market.drainable_discount_max + 1e-9
        )


def test_the_live_price_follows_the_load(config) -> None:
    """Quiet hours are cheaper than the peak, from the same prices in force."""
    quiet, peak = live_tick(config, 2.0), live_tick(config, 20.0)
    for q, p in zip(quiet.pools, peak.pools):
        assert q.guaranteed < p.guaranteed, (q.pool_id, q.guaranteed, p.guaranteed)


def test_a_scheduled_global_resolve_keeps_every_promise(config) -> None:
    """The hourly cold re-solve may move the tick toward another optimum, but only inside the
    max step from the prices in force, the cap and the band."""
    promises = Promises.from_config(config)
    serving, problem = default_fleet_market(config, 15.0, typical=20.0)
    pools = config_pools(config, serving, demand=15.0, guaranteed_share=0.8, drainable_share=0.5)
    tick = run_market_tick(
        pools, problem, promises, solver_settings(config), global_resolve=True, switch_threshold=0.0
    )
    for record, p in zip(tick.pools, pools):
        assert abs(record.guaranteed / p.in_force_guaranteed - 1) <= promises.max_step + 1e-9
        assert record.guaranteed <= p.list_price * promises.guaranteed_cap + 1e-9
        band = 1 - record.drainable / record.guaranteed
        assert promises.discount_min - 1e-9 <= band <= promises.discount_max + 1e-9


def test_an_exhausted_pool_says_so_instead_of_asking_for_capacity() -> None:
    # every node already serves (serving == reachable): capacity cannot come; the operator must add nodes
    record = short_pool_record(serving_gpus=64.0, reachable_gpus=64.0)
    assert not record.certified
    assert (
        "pool exhausted" in record.guaranteed_reason and "capacity must come" not in record.guaranteed_reason
    )
    assert record.capacity_target_gpus == pytest.approx(64.0)


def test_float_dust_below_zero_is_zero_and_a_real_negative_count_is_refused() -> None:
    """A simulation stopped at tick 526 of 720 on `demand_gpus = -1.1e-16`: a count a few ulps
    below zero out of float sums is zero. A count truly below zero is still bad input."""
    dusty = pool(demand_gpus=-1.1102230246251565e-16, backlog_gpus=-2e-15)
    assert dusty.demand_gpus == 0.0 and dusty.backlog_gpus == 0.0
    assert run_market_tick([dusty], None, Promises()).pools[0].demand_gpus == 0.0
    with pytest.raises(MarketTickError, match="demand_gpus must be finite and >= 0"):
        pool(demand_gpus=-1e-3)
    with pytest.raises(MarketTickError, match="backlog_gpus"):
        pool(backlog_gpus=float("nan"))


def test_a_pool_without_evidence_holds_its_prices_and_a_moved_price_says_why() -> None:
    """Cold start: with no demand ever observed the solver has nothing to price on (its tenants'
    valuation scales to the floor, and every price fell by the max step). Such a pool holds the
    prices in force, and says so; a price the solver moves names the move and the load."""
    from market_pipeline.tick.live import price_source

    held = run_market_tick([pool(in_force_guaranteed=1.8, hold_reason="no demand yet")], None, Promises())
    record = held.pools[0]
    assert record.guaranteed == pytest.approx(1.8) and record.drainable == pytest.approx(1.2)
    assert record.guaranteed_reason.startswith("holding the prices in force: no demand yet")
    assert (
        price_source(held.status, record.guaranteed_reason, record.shield_factor, record.certified) == "hold"
    )
    moved = run_market_tick([pool(in_force_guaranteed=1.8)], None, Promises()).pools[0]
    assert moved.guaranteed == pytest.approx(2.0)
    assert moved.guaranteed_reason.startswith(AS_SOLVED) and "+11.1% from 1.8" in moved.guaranteed_reason
    assert price_source("converged", moved.guaranteed_reason, 1.0, True) == "solver"


def test_the_live_inputs_of_an_empty_warehouse_hold_every_pool(tmp_path) -> None:
    from datetime import datetime, timezone

    from market_pipeline.tick.live import pool_tick_inputs, prices_in_force
    from market_pipeline.warehouse import open_warehouse

    config = load_config()
    store = open_warehouse(tmp_path / "w.duckdb")
    now = datetime(2026, 3, 2, 12, tzinfo=timezone.utc)
    inputs = pool_tick_inputs(config, store, now, prices_in_force(config, store), {})
    assert inputs and all(p.hold_reason and "cold start" in p.hold_reason for p in inputs)


@pytest.mark.parametrize(
    ("drainable_share", "edge", "side"),
    [(0.9, "discount_min", "above"), (0.3, "discount_max", "below")],
)
def test_a_drainable_price_outside_the_band_is_published_at_its_edge(
    config, drainable_share: float, edge: str, side: str
) -> None:
    """The band was moved since the prices in force were published (a drainable price at 10% or
    70% below guaranteed) and the solve falls back onto them: the published drainable price is
    the band's edge, and the record says the solver's price was clipped."""
    promises = Promises.from_config(config)
    serving, problem = default_fleet_market(config, 6.0)
    pools = config_pools(config, serving, demand=6.0, guaranteed_share=1.0, drainable_share=drainable_share)
    one_step = replace(solver_settings(config), max_iterations=1)  # too few to converge: fallback
    tick = run_market_tick(pools, problem, promises, one_step)
    assert tick.status == "fallback" and not tick.converged
    discount = getattr(promises, edge)
    for record in tick.pools:
        g = record.guaranteed
        assert g == pytest.approx(record.list_price)  # the guaranteed price in force stays
        if side == "above":  # the solver's price sits between the band's top and the guaranteed price
            assert (1 - promises.discount_min) * g < record.solver_drainable < g
        else:
            assert record.solver_drainable < (1 - promises.discount_max) * g
        assert record.drainable == pytest.approx((1 - discount) * g, rel=1e-12)
        assert f"{side} the drainable band" in record.drainable_reason


def _ends(window) -> tuple:
    return (round(window.low, 12), round(window.high, 12), window.low_by, window.high_by)


def test_each_end_of_a_window_names_the_promise_that_set_it() -> None:
    """The reason a tenant reads for a clipped price names the promise that clipped it."""
    p = Promises(max_step=0.25, guaranteed_cap=1.04, discount_min=0.2, discount_max=0.6)
    assert _ends(guaranteed_window(2.0, 2.0, 0.8, 8.0, p)) == (1.5, 2.08, "max step", "guaranteed cap")
    assert _ends(guaranteed_window(2.0, 2.0, 1.6, 2.05, p)) == (1.6, 2.05, "price_min", "price_max")
    assert _ends(guaranteed_window(1.0, 2.0, 0.5, 8.0, p)) == (0.75, 1.25, "max step", "max step")
    # a price in force the step cannot bring into the window: the window's nearer end wins
    assert _ends(guaranteed_window(9.27, 4.2, 2.0, 14.0, p)) == (
        4.368,
        4.368,
        "guaranteed cap",
        "guaranteed cap",
    )
    assert _ends(guaranteed_window(1.0, 4.2, 2.0, 14.0, p)) == (2.0, 2.0, "price_min", "price_min")
    # the drainable band below a guaranteed price of 2.0 is [0.8, 1.6]
    band = "drainable band"
    assert _ends(drainable_window(1.2, 2.0, 0.1, p)) == (0.9, 1.5, "max step", "max step")
    assert _ends(drainable_window(1.2, 2.0, 1.0, p)) == (
        1.0,
        1.5,
        band,
        "max step",
    )  # the floor lifts its bottom
    assert _ends(drainable_window(1.0, 2.0, 0.1, p)) == (0.8, 1.25, band, "max step")
    assert _ends(drainable_window(1.5, 2.0, 0.1, p)) == (1.125, 1.6, "max step", band)
    assert _ends(drainable_window(3.0, 2.0, 0.1, p)) == (1.6, 1.6, band, band)


def test_a_price_on_the_window_edge_is_published_as_it_is() -> None:
    window = guaranteed_window(2.0, 2.0, 0.8, 8.0, Promises())
    assert window.clip(window.high) == (window.high, None)
    assert window.clip(window.low) == (window.low, None)
    just_above = window.high * (1 + 1e-10)  # rounding, not a broken promise
    assert window.clip(just_above) == (just_above, None)
    assert window.clip(2.5) == (window.high, "2.5 above the guaranteed cap 2.08")
    assert window.clip(1.0) == (window.low, "1 below the max step 1.5")


BAND_REFUSED = "drainable band: need 0 <= discount_min <= discount_max < 1"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_step", 0.0, "max_step: must be finite and > 0, got 0.0"),
        ("max_step", float("inf"), "max_step: must be finite and > 0, got inf"),
        ("guaranteed_cap", 0.99, "guaranteed_cap: must be finite and >= 1, got 0.99"),
        ("guaranteed_cap", float("nan"), "guaranteed_cap: must be finite and >= 1, got nan"),
        ("discount_min", -0.1, BAND_REFUSED),
        ("discount_min", 0.7, BAND_REFUSED),
        ("discount_max", 1.0, BAND_REFUSED),
    ],
)
def test_promises_that_cannot_be_kept_are_refused(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Promises(**{field: value})


def test_promises_at_their_limits_are_accepted() -> None:
    assert (
        Promises(max_step=1e-6, guaranteed_cap=1.0, discount_min=0.0, discount_max=0.0).guaranteed_cap == 1.0
    )
    assert Promises(discount_min=0.5, discount_max=0.5).discount_max == 0.5


def test_the_promises_are_the_configured_ones() -> None:
    overrides = {
        "MP__MARKET__MAX_PRICE_STEP": "0.1",
        "MP__MARKET__GUARANTEED_PRICE_CAP": "1.2",
        "MP__MARKET__DRAINABLE_DISCOUNT_MIN": "0.3",
        "MP__MARKET__DRAINABLE_DISCOUNT_MAX": "0.5",
    }
    promises = Promises.from_config(load_config(DEFAULT_CONFIG_PATH, environ=overrides))
    assert promises == Promises(max_step=0.1, guaranteed_cap=1.2, discount_min=0.3, discount_max=0.5)


def test_guarantee_reach_is_the_share_of_waiting_guaranteed_gpus_drains_could_free() -> None:
    assert guarantee_reach(0.0, 0.0) == 1.0  # nothing waits: the promise holds, the premium stands
    assert guarantee_reach(5.0, 0.0) == 1.0
    assert guarantee_reach(0.0, 26.0) == 0.0  # guaranteed work waits and nothing could be drained
    assert guarantee_reach(-1e-15, 26.0) == 0.0  # float dust is no drainable work
    assert guarantee_reach(13.0, 26.0) == pytest.approx(0.5)
    assert guarantee_reach(40.0, 26.0) == 1.0
    with pytest.raises(MarketTickError, match="guarantee_reach"):
        pool(guarantee_reach=1.5)


def test_a_pool_whose_guarantee_backs_no_premium_publishes_its_guaranteed_price_at_list() -> None:
    """With `premium_follows_reach`: guaranteed work waits where nothing could be drained for
    it (#46: `V100` pools full of work pinned to them). The shield, which publishes the cap for
    a backlog no price drains, stops at list; half backed, half the premium; the drainable
    band follows."""
    capped = short_pool_record(follows_reach=True)
    assert capped.guaranteed == pytest.approx(2.0 * 1.04)
    unbacked = short_pool_record(follows_reach=True, guarantee_reach=0.0)
    assert unbacked.guaranteed == pytest.approx(2.0)
    assert "guarantee reach" in unbacked.guaranteed_reason
    assert unbacked.drainable <= 2.0 * (1 - 0.2) * (1 + 1e-12)
    assert short_pool_record(follows_reach=True, guarantee_reach=0.5).guaranteed == pytest.approx(2.0 * 1.02)
    # off (the default): the cap alone, whatever the reach
    assert short_pool_record(guarantee_reach=0.0).guaranteed == pytest.approx(2.0 * 1.04)
    promises = Promises(guaranteed_cap=1.04, premium_follows_reach=True)
    assert promises.guaranteed_ceiling(2.0, 2.05, 0.5) == pytest.approx(2.025)  # price_max binds first
    assert promises.guaranteed_ceiling(2.0, 1.5, 0.0) == 1.5  # never above price_max


def test_the_live_inputs_read_what_the_guarantee_can_back_off_the_latest_snapshot(tmp_path) -> None:
    """The fleet inventory records per pool the GPUs drainable tasks hold and those waiting
    guaranteed jobs ask for; the live tick's inputs turn the latest into the pool's reach.
    Snapshots written before the columns existed (null) read as nothing waiting."""
    from datetime import datetime, timedelta, timezone

    from market_pipeline.fleet.demand import pool_snapshot
    from market_pipeline.hardware.protocol import NodeInfo, NodeState, ResourceClass, TaskInfo, TaskKind
    from market_pipeline.tick.live import pool_tick_inputs, prices_in_force
    from market_pipeline.warehouse import open_warehouse

    config = load_config()
    first, second = config.pools[0], config.pools[1]
    store = open_warehouse(tmp_path / "w.duckdb")
    now = datetime(2026, 3, 2, 12, tzinfo=timezone.utc)

    def task(task_id: str, gpus: int, resource_class: ResourceClass) -> TaskInfo:
        return TaskInfo(
            task_id=task_id,
            tenant_id="t1",
            pool_id=first.pool_id,
            node_id="n1",
            gpu_uuids=tuple(f"g{i}-{task_id}" for i in range(gpus)),
            gpu_milli=1000,
            kind=TaskKind.TRAINING,
            qos="BE",
            priority=0,
            resource_class=resource_class,
            started_at=now - timedelta(hours=1),
        )

    nodes = [NodeInfo("n1", first.pool_id, first.gpu_model, first.zone, 8, NodeState.ON)]
    tasks = [task("d", 2, ResourceClass.DRAINABLE), task("g", 6, ResourceClass.GUARANTEED)]
    queue = {first.gpu_model: {"gpus": 12.0, "guaranteed_gpus": 8.0}}
    snapshot = pool_snapshot(config, nodes, tasks, queue, now - timedelta(minutes=5))
    row = snapshot.filter(snapshot["pool_id"] == first.pool_id).row(0, named=True)
    pools_of_model = sum(p.gpu_model == first.gpu_model for p in config.pools)
    assert row["running_gpus"] == 8.0 and row["drainable_running_gpus"] == 2.0
    assert row["guaranteed_pending_gpus"] == pytest.approx(8.0 / pools_of_model)
    store.append("pool_demand_snapshots", snapshot)
    old = snapshot.select("ts", "pool_id", "running_gpus", "pending_gpus", "gpus_on").with_columns(
        (snapshot["ts"] - timedelta(minutes=5)).alias("ts")
    )
    store.append("pool_demand_snapshots", old)  # an older row without the columns
    inputs = {p.pool_id: p for p in pool_tick_inputs(config, store, now, prices_in_force(config, store), {})}
    assert inputs[first.pool_id].guarantee_reach == pytest.approx(2.0 / (8.0 / pools_of_model))
    assert inputs[second.pool_id].guarantee_reach == 1.0  # nothing waits there
    # the guaranteed class's claim now (`tick.pricing.drainable_capacity`): running less
    # drainable, plus the guaranteed queue, off the same snapshot
    from market_pipeline.warehouse.readers import guaranteed_claim_by_pool

    claim = guaranteed_claim_by_pool(store, now)
    assert claim[first.pool_id] == pytest.approx(6.0 + 8.0 / pools_of_model)
    assert claim[second.pool_id] == 0.0
    assert guaranteed_claim_by_pool(store, now - timedelta(minutes=5)) == {}  # only null rows before
