"""The price promises have one home (`tick.promises`): the tick, the simulator, the replay,
quotes and the checks read a `Promises` built from config and ask it for the ceiling, the
band, the step's reach and the breaches. A module that reads the promise keys off the config
itself is a second copy that can drift."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from market_pipeline.config import load_config
from market_pipeline.tick import Promises

ROOT = Path(__file__).resolve().parents[2]
PROMISE_KEYS = {"max_price_step", "guaranteed_price_cap", "drainable_discount_min", "drainable_discount_max"}
HOME = {
    "market_pipeline/config/model.py",  # where the keys are declared and validated
    "market_pipeline/tick/promises.py",  # where they become a Promises
}


def _reads_a_promise_key(path: Path) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(node, ast.Attribute) and node.attr in PROMISE_KEYS for node in ast.walk(tree))


def test_only_the_promises_home_reads_the_promise_keys_off_the_config() -> None:
    readers = sorted(
        str(path.relative_to(ROOT))
        for top in ("market_pipeline", "assets", "sensors")
        for path in (ROOT / top).rglob("*.py")
        if str(path.relative_to(ROOT)) not in HOME and _reads_a_promise_key(path)
    )
    assert readers == [], f"read the promises through tick.promises.Promises instead: {readers}"


def test_from_config_keeps_the_configured_cap_unless_a_caller_prices_under_another() -> None:
    config = load_config()
    market = config.market
    promises = Promises.from_config(config)
    assert (promises.max_step, promises.guaranteed_cap) == (
        market.max_price_step,
        market.guaranteed_price_cap,
    )
    assert (promises.discount_min, promises.discount_max) == (
        market.drainable_discount_min,
        market.drainable_discount_max,
    )
    assert Promises.from_config(config, guaranteed_cap=2.5).guaranteed_cap == 2.5
    with pytest.raises(ValueError, match="guaranteed_cap"):
        Promises.from_config(config, guaranteed_cap=0.5)


def test_the_ceilings_band_and_reach_are_worked_out_once() -> None:
    p = Promises(max_step=0.25, guaranteed_cap=1.04, discount_min=0.2, discount_max=0.6)
    assert p.guaranteed_ceiling(list_price=2.4, price_max=9.0) == pytest.approx(2.496)
    assert p.guaranteed_ceiling(list_price=2.4, price_max=2.0) == 2.0  # the pool's bound wins
    assert p.drainable_ceiling(list_price=2.4, price_max=9.0) == pytest.approx(2.496 * 0.8)
    assert p.drainable_floor(1.0) == pytest.approx(0.4)
    assert p.band(2.0) == pytest.approx((0.8, 1.6))
    assert p.band_mid() == pytest.approx(0.4)
    assert p.step_range(2.0) == pytest.approx((1.5, 2.5))
    assert p.reach(2) == pytest.approx((0.5625, 1.5625))


def test_breaches_count_the_cap_and_the_step_with_the_books_tolerance() -> None:
    p = Promises(max_step=0.25, guaranteed_cap=1.04)
    lists = np.array([2.0, 1.0])
    assert p.over_cap(np.array([2.08, 1.05]), lists).tolist() == [False, True]
    old = np.array([1.0, 1.0, 1.0])
    assert p.over_step(np.array([1.25, 0.75, 1.26]), old).tolist() == [False, False, True]
    # the step is relative to the price before: 20% from 4.0 is inside a 25% step, 30% is not
    assert p.over_step(np.array([4.8, 3.2, 5.2]), np.full(3, 4.0)).tolist() == [False, False, True]
    # a free resource (price 0) that stays free, or moves by the 1e-12 rounding slack, keeps
    # the step; the cap over a list price of 0 holds a guaranteed price of 0
    zero = np.zeros(3)
    assert p.over_step(np.array([0.0, 1e-12, 1e-9]), zero).tolist() == [False, False, True]
    assert p.over_cap(np.array([0.0, 1e-9]), np.zeros(2)).tolist() == [False, True]
