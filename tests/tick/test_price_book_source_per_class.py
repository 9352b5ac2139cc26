"""Each class of the price book carries its own source and reason: the drainable price of a
pool whose guaranteed price was shielded (or not certified) is "shield" only where it
followed the shield; priced as solved, it is the solver's."""

from __future__ import annotations

import datetime as dt

import polars as pl

from market_pipeline.config import load_config
from market_pipeline.tick.live import TICK_SCHEMA, published_rows

TICK = dt.datetime(2026, 3, 2, 9, tzinfo=dt.timezone.utc)


def _tick(pool: str, *, factor: float, certified: bool, g_reason: str, d_reason: str) -> pl.DataFrame:
    row = {name: None for name in TICK_SCHEMA}
    row.update(
        tick_at=TICK,
        solve_id="s1",
        pool_id=pool,
        status="converged",
        list_price=2.0,
        solver_guaranteed=2.0,
        solver_drainable=1.5,
        guaranteed=2.0 * factor,
        drainable=1.5 * (factor if "follows" in d_reason else 1.0),
        guaranteed_reason=g_reason,
        drainable_reason=d_reason,
        certified=certified,
        margin=0.0,
        required_margin=0.0,
        serving_gpus=8.0,
        capacity_target_gpus=8.0,
        equilibrium_price=2.0,
        shield_factor=factor,
        demand_gpus=4.0,
        backlog_gpus=0.0,
        forecast_upper_gpus=4.0,
        shadow=False,
    )
    return pl.DataFrame([row], schema=TICK_SCHEMA)


def _sources(frame: pl.DataFrame) -> dict[str, tuple[str, str]]:
    return {r["resource_class"]: (r["source"], r["intervention_reason"]) for r in frame.iter_rows(named=True)}


def test_an_uncertified_pools_drainable_price_as_solved_is_the_solvers():
    config = load_config()
    pool = config.pools[0].pool_id
    tick = _tick(
        pool, factor=1.0, certified=False, g_reason="backlog shield: no price certifies", d_reason="as solved"
    )
    sources = _sources(published_rows(config, tick))
    assert sources["guaranteed"] == ("shield", "backlog shield: no price certifies")
    assert sources["drainable"] == ("solver", "as solved")


def test_a_drainable_price_that_followed_the_shield_says_so():
    config = load_config()
    pool = config.pools[0].pool_id
    tick = _tick(
        pool,
        factor=1.05,
        certified=True,
        g_reason="backlog shield x1.050: raised",
        d_reason="follows the guaranteed shield x1.050",
    )
    sources = _sources(published_rows(config, tick))
    assert sources["guaranteed"][0] == "shield"
    assert sources["drainable"] == ("shield", "follows the guaranteed shield x1.050")
