"""The checks on the decision assets fail on bad decisions and pass on good ones, read from
a real warehouse (market_pipeline.decision_checks)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from market_pipeline.config import load_config
from market_pipeline.decision_checks.drains import approved_drains, drain_limits_verdict
from market_pipeline.decision_checks.flapping import flapping_verdict, node_actions
from market_pipeline.decision_checks.margins import plan_margin_verdict, tick_margin_verdict
from market_pipeline.decision_checks.node_drains import node_drain_verdict
from market_pipeline.decision_checks.prices import (
    offending_prices,
    price_rules,
    promise_frame,
)
from market_pipeline.decision_checks.solve import solve_verdict
from market_pipeline.drain.limits import DrainLimits, DrainReason
from market_pipeline.tick.live import TICK_SCHEMA, base_price_rows, price_frame, price_row
from market_pipeline.warehouse import Warehouse
from market_pipeline.warehouse.readers import latest_plan, latest_uncordons, published_with_previous

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def config():
    return load_config()


@pytest.fixture
def store(migrated_warehouse: Warehouse) -> Warehouse:
    return migrated_warehouse


def test_solve_is_certified_only_when_converged_within_tolerance() -> None:
    good = {"solve_id": "s1", "status": "converged", "kkt_residual": 1e-9, "fallback_reason": None}
    assert solve_verdict(good, 1e-6).passed
    assert solve_verdict({**good, "status": "capacity_infeasible"}, 1e-6).passed  # the shield asks capacity
    over = solve_verdict({**good, "kkt_residual": 1e-3}, 1e-6)
    assert not over.passed and "KKT residual 0.001 > tolerance 1e-06" in over.description
    assert not over.expected  # a certified status over tolerance is a solver defect: it fails
    fallback = solve_verdict({**good, "status": "fallback", "fallback_reason": "diverged"}, 1e-6)
    # a fallback with its reason is an expected outcome: the check warns, the prices in force stay
    assert not fallback.passed and fallback.expected and "diverged" in fallback.description
    assert "prices in force" in fallback.description
    silent = solve_verdict({**good, "status": "fallback", "fallback_reason": None}, 1e-6)
    assert not silent.passed and not silent.expected  # a fallback that cannot say why is a defect
    assert not solve_verdict({**good, "status": "bogus"}, 1e-6).expected
    assert not solve_verdict({**good, "kkt_residual": None}, 1e-6).passed
    assert not solve_verdict({**good, "kkt_residual": float("nan")}, 1e-6).passed
    assert not solve_verdict(None, 1e-6).passed


def tick(margin: float, serving: float, target: float, reachable: float | None = 256.0) -> pl.DataFrame:
    row = {name: None for name in TICK_SCHEMA}
    row.update(
        tick_at=T0,
        pool_id="p",
        margin=margin,
        serving_gpus=serving,
        capacity_target_gpus=target,
        reachable_gpus=reachable,
    )
    return pl.DataFrame([row], schema=TICK_SCHEMA)


def test_a_negative_tick_margin_must_have_asked_for_capacity() -> None:
    assert tick_margin_verdict(tick(3.0, 40.0, 32.0)).passed
    assert tick_margin_verdict(tick(-12.4, 48.0, 64.0)).passed  # capacity asked: the plan sizes to it
    bad = tick_margin_verdict(tick(-0.5, 48.0, 48.0))
    assert not bad.passed and bad.offenders[0]["pool_id"] == "p" and not bad.expected
    assert not tick_margin_verdict(tick(float("nan"), 48.0, 64.0)).passed
    # an exhausted pool (every node it has already serves) cannot ask for capacity: only an
    # operator can add nodes. That is an expected outcome: the check warns and names the pool
    exhausted = tick_margin_verdict(tick(-0.5, 2.0, 2.0, reachable=2.0))
    assert not exhausted.passed and exhausted.expected
    assert "exhausted" in exhausted.description and "p" in exhausted.description
    # a tick stored before the reachable capacity was recorded is judged as before
    assert not tick_margin_verdict(tick(-0.5, 2.0, 2.0, reachable=None)).expected


def write_scale(store: Warehouse, rows: list[dict]) -> None:
    frame = pl.DataFrame(
        [
            {
                "decision_id": f"scale-{i}",
                "kind": "scale",
                "pool_id": "p",
                "target": None,
                "action": "hold",
                "allowed": True,
                "shadow": False,
                "reasons": ["r"],
                "inputs": "{}",
                "decided_at": T0,
                "outcome": None,
                **row,
            }
            for i, row in enumerate(rows)
        ],
        schema_overrides={
            "decided_at": pl.Datetime("us", "UTC"),
            "reasons": pl.List(pl.Utf8),
            "target": pl.Utf8,
            "outcome": pl.Utf8,
        },
    )
    store.append("decisions", frame)


def plan_inputs(margin: float, certified: bool = True, target: int = 4, max_nodes: int = 10) -> str:
    return json.dumps(
        {
            "certificate_margin": margin,
            "target_certified": certified,
            "target_nodes": target,
            "max_nodes": max_nodes,
        }
    )


def test_plan_margins_fail_on_an_uncertified_target_or_a_removal_the_certificate_needs(store) -> None:
    write_scale(
        store,
        [{"inputs": plan_inputs(2.0)}, {"action": "cordon", "target": "n1", "inputs": plan_inputs(5.0)}],
    )
    assert plan_margin_verdict(latest_plan(store)).passed
    later = T0 + timedelta(minutes=5)
    write_scale(
        store,
        [
            {"decision_id": "late-0", "decided_at": later, "inputs": plan_inputs(-1.0, certified=False)},
            {
                "decision_id": "late-1",
                "decided_at": later,
                "action": "cordon",
                "target": "n2",
                "inputs": plan_inputs(-3.0),
            },
            {
                "decision_id": "late-2",
                "decided_at": later,
                "action": "uncordon",
                "target": "n3",
                "inputs": plan_inputs(-3.0),
            },
        ],
    )  # an uncordon that restores capacity is fine
    bad = plan_margin_verdict(latest_plan(store))
    assert not bad.passed
    assert [(o["action"], o["target"]) for o in bad.offenders] == [("target", ""), ("cordon", "n2")]
    at_max = plan_margin_verdict(
        pl.DataFrame(
            [
                {
                    "pool_id": "p",
                    "target": None,
                    "action": "hold",
                    "allowed": True,
                    "shadow": False,
                    "inputs": plan_inputs(-1.0, False, 10, 10),
                }
            ]
        )
    )
    assert at_max.passed  # every node is in: nothing more the plan could do


def publish(store: Warehouse, config, at: datetime, changes: dict[str, float]) -> None:
    """Publish every resource of the first pool at its list price, but for `changes`."""
    pool = config.pools[0]
    base = base_price_rows(config, at).filter(pl.col("pool_id") == pool.pool_id)
    rows = [
        price_row(
            pool,
            r["resource_class"],
            changes.get(r["resource_class"], float(r["price_per_gpu_hour"])),
            at,
            "solve-x",
            "solver",
            float(r["list_price_per_gpu_hour"]),
            None,
            "as solved",
        )
        for r in base.iter_rows(named=True)
    ]
    store.append("price_book", price_frame(rows))


def test_price_promises_are_checked_with_great_expectations(store, config) -> None:
    pool = config.pools[0]
    listed = pool.base_price
    drainable_list = float(
        base_price_rows(config, T0).filter(
            (pl.col("pool_id") == pool.pool_id) & (pl.col("resource_class") == "drainable")
        )["price_per_gpu_hour"][0]
    )
    publish(store, config, T0, {})
    step = config.market.max_price_step
    cases = [  # (guaranteed, drainable, the promise it breaks)
        (listed * 1.03, drainable_list * (1 + step * 0.9), None),  # under the cap, inside the step
        (listed * (1 - step * 1.5), listed * (1 - step * 1.5) * 0.6, "step"),
        (listed * 0.97, listed * 0.97 * (1 - config.market.drainable_discount_min / 2), "band"),
        (pool.price_max * 2, drainable_list, "bound"),
    ]
    for i, (g, d, broken) in enumerate(cases):
        at = T0 + timedelta(minutes=5 * (i + 1))
        publish(store, config, at, {"guaranteed": g, "drainable": d})
        frame = promise_frame(published_with_previous(store, at), config)
        report, offending = price_rules(frame), offending_prices(frame)
        assert report.passed is (broken is None), (broken, report.markdown())
        if broken:
            assert broken in offending["promise"].to_list()
        store.execute("DELETE FROM price_book WHERE effective_from = ?", [at])  # the next case steps from T0


def write_drains(store: Warehouse, drains: list[dict]) -> None:
    first = store.query("SELECT count(*) AS n FROM decisions")["n"][0]
    rows = [
        {
            "decision_id": f"d{first + i}",
            "kind": "drain",
            "pool_id": d.get("pool", "p"),
            "target": f"task-{i}",
            "action": "drain_task",
            "allowed": True,
            "shadow": False,
            "reasons": ["x"],
            "inputs": json.dumps(
                {
                    "tenant_id": d.get("tenant", "t1"),
                    "node_id": d.get("node", f"n{i}"),
                    "trigger": d.get("trigger", "scale_down"),
                }
            ),
            "decided_at": T0 - timedelta(minutes=d.get("ago", 1)),
            "outcome": d.get("outcome", "terminated"),
        }
        for i, d in enumerate(drains)
    ]
    store.append(
        "decisions",
        pl.DataFrame(
            rows,
            schema_overrides={
                "decided_at": pl.Datetime("us", "UTC"),
                "reasons": pl.List(pl.Utf8),
                "outcome": pl.Utf8,
            },
        ),
    )


def test_drains_past_a_tenant_cap_or_a_pool_budget_fail(store, config) -> None:
    limits = DrainLimits.from_config(config)
    cap = limits.tenant_max_drains_per_day
    write_drains(
        store,
        [{"ago": 60 * i} for i in range(cap)]
        + [{"tenant": "t2", "trigger": "budget"}] * (cap + 1)  # the tenant's own budget: exempt
        + [{"tenant": "t3", "outcome": "aborted"}] * (cap + 1)  # disrupted nothing
        + [{"tenant": "t4", "ago": 25 * 60}] * (cap + 1),
    )  # yesterday's
    drains, now = approved_drains(store)
    assert drain_limits_verdict(drains, now, limits, {"p": 10}).passed
    write_drains(store, [{"tenant": "t1", "ago": 0}])
    drains, now = approved_drains(store)
    over = drain_limits_verdict(drains, now, limits, {"p": 10})
    assert not over.passed and over.offenders[0]["limit"] == "tenant_cap" and over.offenders[0]["who"] == "t1"


def test_open_drains_past_the_pool_budget_fail(store, config) -> None:
    limits = DrainLimits.from_config(config)
    allowance = limits.pool_allowance(DrainReason.SCALE_DOWN, 10, T0)
    write_drains(store, [{"tenant": f"t{i}", "outcome": None, "node": f"n{i}"} for i in range(allowance)])
    drains, now = approved_drains(store)
    assert drain_limits_verdict(drains, now, limits, {"p": 10}).passed
    write_drains(store, [{"tenant": "tx", "outcome": None, "node": "n-extra"}])
    drains, now = approved_drains(store)
    over = drain_limits_verdict(drains, now, limits, {"p": 10})
    assert not over.passed and over.offenders[0]["limit"] == "pool_budget"


def test_a_node_cordoned_three_times_a_day_flaps(store) -> None:
    hours = [1, 3, 5]
    write_scale(
        store,
        [
            {
                "decision_id": f"c{h}",
                "action": "cordon",
                "target": "a10-hz-a-06",
                "decided_at": T0 + timedelta(hours=h),
                "outcome": "ok: cordoned",
            }
            for h in hours[:2]
        ]
        + [
            {
                "decision_id": f"u{h}",
                "action": "uncordon",
                "target": "a10-hz-a-06",
                "decided_at": T0 + timedelta(hours=h, minutes=30),
                "outcome": "ok",
            }
            for h in hours[:2]
        ]
        + [
            {
                "decision_id": "superseded",
                "action": "cordon",
                "target": "a10-hz-a-06",
                "decided_at": T0 + timedelta(hours=4),
                "outcome": "superseded: the plan of 2026-03-02T16:05:00+00:00 re-decided",
            }
        ],
    )
    assert flapping_verdict(node_actions(store)).passed  # twice a day is the limit; superseded never acted
    write_scale(
        store,
        [
            {
                "decision_id": "third",
                "action": "cordon",
                "target": "a10-hz-a-06",
                "decided_at": T0 + timedelta(hours=5),
            }
        ],
    )
    verdict = flapping_verdict(node_actions(store))
    assert not verdict.passed and verdict.offenders[0]["node_id"] == "a10-hz-a-06"
    assert (verdict.offenders[0]["cordons"], verdict.offenders[0]["uncordons"]) == (3, 2)
    a_day_later = node_actions(store, until=T0 + timedelta(hours=26))
    assert flapping_verdict(a_day_later).passed  # the first cordons left the 24-hour window


def test_a_guaranteed_task_past_its_sla_beside_drainable_work_breaks_the_rigid_guarantee() -> None:
    from market_pipeline.decision_checks.guarantee import rigid_guarantee_verdict

    row = {"jobs": 3.0, "gpus": 10.0, "guaranteed_jobs": 1.0, "drainable_running_gpus": 4.0}
    fine = rigid_guarantee_verdict({"A100": {**row, "guaranteed_oldest_wait_s": 300.0}}, 600.0)
    assert fine.passed and fine.numbers["guaranteed_waiting"] == 1
    late = rigid_guarantee_verdict({"A100": {**row, "guaranteed_oldest_wait_s": 900.0}}, 600.0)
    assert not late.passed and late.offenders[0]["gpu_model"] == "A100"
    # nothing drainable left to make room from: capacity is short, not the guarantee broken
    full = rigid_guarantee_verdict(
        {"A100": {**row, "guaranteed_oldest_wait_s": 900.0, "drainable_running_gpus": 0.0}}, 600.0
    )
    assert full.passed


def test_each_published_price_sits_beside_the_ends_every_promise_allows(config) -> None:
    """The windows the price check holds each price to, worked out by hand from the shipped
    config (A100: list 2.4, bounds 1..9; H800: list 4.2, bounds 2..14; A10: list 0.7, bounds
    0.3..3; cap 1.04 x list, band 20-60% below guaranteed, step 25%); a price past an end by
    more than the book's rounding (1e-6) is named with the promise it breaks."""
    a100, h800, a10 = "A100-80GB@cn-hangzhou-a", "H800@cn-beijing-b", "A10@cn-hangzhou-a"
    big = float("inf")
    ga, gh = 2.496 + 5e-7, 4.368 + 2e-6  # the guaranteed prices the bands hang from
    published = _book(
        [
            (a100, "guaranteed", ga, 2.0),  # at the cap, within the rounding
            (a100, "drainable", 1.5, 1.2),  # at the step's top
            (h800, "guaranteed", gh, None),  # past the cap; first publication: no step
            (h800, "drainable", 3.4944, 20.0),  # from far above: the step lands on the window's top
            (a10, "guaranteed", 0.2, 0.1),  # under price_min, and the step cannot reach the bounds
            ("nowhere", "guaranteed", 1.0, None),  # an unknown pool fails
        ]
    )
    frame = promise_frame(published, config)
    ends = frame.select(
        "resource",
        *(
            c
            for pair in (("bound_low", "bound_high"), ("band_low", "band_high"), ("step_low", "step_high"))
            for c in pair
        ),
    )
    expected = [
        (f"{a100}/guaranteed", 1.0, 2.496, 0.0, big, 1.5, 2.5),
        (f"{a100}/drainable", 0.4, 1.9968, 0.4 * ga, 0.8 * ga, 0.9, 1.5),
        (f"{h800}/guaranteed", 2.0, 4.368, 0.0, big, 0.0, big),
        (f"{h800}/drainable", 0.8, 3.4944, 0.4 * gh, 0.8 * gh, 3.4944, 3.4944),
        (f"{a10}/guaranteed", 0.3, 0.728, 0.0, big, 0.3, 0.3),
    ]
    for row, (resource, *values) in zip(ends.iter_rows(), expected):
        assert row[0] == resource
        lows_highs = [v - 1e-6 if i % 2 == 0 else v + 1e-6 for i, v in enumerate(values)]
        for got, want in zip(row[1:], lows_highs):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12) or (got > 1e300 and want == big), (
                row,
                values,
            )
    unknown = frame.row(5, named=True)
    assert unknown["resource"] == "nowhere/guaranteed" and unknown["bound_low"] > unknown["bound_high"]
    offending = offending_prices(frame)
    assert list(zip(offending["resource"], offending["promise"])) == [
        (f"{h800}/guaranteed", "bound"),
        (f"{a10}/guaranteed", "bound"),
        ("nowhere/guaranteed", "bound"),
        (f"{a10}/guaranteed", "step"),
    ]
    first = offending.row(0, named=True)
    assert first["price"] == gh and first["previous"] is None
    assert (first["low"], first["high"]) == (pytest.approx(2.0 - 1e-6), pytest.approx(4.368 + 1e-6))
    report = price_rules(frame)
    assert not report.passed
    assert price_rules(frame.head(2)).passed and offending_prices(frame.head(2)).is_empty()


def test_a_failed_scale_down_drain_warns_at_the_tick_that_gives_the_node_back(store) -> None:
    """The cordon's run succeeded hours before; the plan that uncordons the node because its
    drain timed out says so (WARN, with the node and why), not silence."""
    later = T0 + timedelta(minutes=40)
    write_scale(
        store,
        [
            {"decision_id": "c1", "action": "cordon", "target": "n1", "outcome": "ok: cordoned"},
            {
                "decision_id": "u1",
                "action": "uncordon",
                "target": "n1",
                "decided_at": later,
                "reasons": ["scale-down failed: drain timed out", "attempt 1/3"],
                "inputs": json.dumps({"drain_failures": 1}),
            },
            {  # an uncordon because demand came back is no failure
                "decision_id": "u2",
                "action": "uncordon",
                "target": "n2",
                "decided_at": later,
                "reasons": ["demand returned"],
            },
            {"decision_id": "h1", "action": "hold", "decided_at": later},
        ],
    )
    verdict = node_drain_verdict(latest_uncordons(store))
    assert not verdict.passed and verdict.expected  # a warning, not a failure
    assert verdict.offenders == [
        {
            "pool_id": "p",
            "node": "n1",
            "why": "drain timed out",
            "attempt": "attempt 1/3",
            "drain_failures": 1,
        }
    ]
    assert "n1 (drain timed out)" in verdict.description and verdict.numbers == {"failed_node_drains": 1}
    # the next plan, with no failed drain: the check passes again
    write_scale(store, [{"decision_id": "h2", "action": "hold", "decided_at": later + timedelta(minutes=5)}])
    assert node_drain_verdict(latest_uncordons(store)).passed


def _book(rows: list[tuple]) -> pl.DataFrame:
    schema = {"pool_id": pl.Utf8, "resource_class": pl.Utf8, "price": pl.Float64, "previous": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(source=pl.lit("tick"))


def test_a_step_that_cannot_reach_the_window_lands_on_the_nearer_end_of_all_promises(config) -> None:
    """The window a step-stranded price must land on is what the bounds AND the band leave,
    so its top is the lower of the two tops and its bottom the higher of the two bottoms
    (A10: bounds 0.3..3, cap 0.728; guaranteed 0.5, so the drainable band is 0.2..0.4 and the
    drainable bounds 0.12..0.5824)."""
    a10 = "A10@cn-hangzhou-a"
    guaranteed = (a10, "guaranteed", 0.5, 0.5)
    from_above = promise_frame(_book([guaranteed, (a10, "drainable", 0.4, 5.0)]), config)
    from_below = promise_frame(_book([guaranteed, (a10, "drainable", 0.2, 0.01)]), config)
    for frame, end in ((from_above, 0.4), (from_below, 0.2)):
        drainable = frame.row(1, named=True)
        assert drainable["step_low"] == pytest.approx(end - 1e-6, abs=1e-12)
        assert drainable["step_high"] == pytest.approx(end + 1e-6, abs=1e-12)
        assert price_rules(frame).passed and offending_prices(frame).is_empty()


def test_a_price_exactly_at_the_books_rounding_allowance_keeps_its_promise(config) -> None:
    """Each end is inclusive: a price exactly 1e-6 past an end (the book's rounding) passes
    the great-expectations rules and the operator's table; one more step past it does not."""
    from market_pipeline.tick.promises import Promises

    a10, a100 = "A10@cn-hangzhou-a", "A100-80GB@cn-hangzhou-a"
    cap = min(config.pool_by_id[a100].price_max, Promises.from_config(config).guaranteed_cap * 2.4)
    low = config.pool_by_id[a10].price_min - 1e-6
    high = cap + 1e-6
    at_ends = promise_frame(_book([(a10, "guaranteed", low, None), (a100, "guaranteed", high, None)]), config)
    assert at_ends["bound_low"][0] == low and at_ends["bound_high"][1] == high
    assert price_rules(at_ends).passed and offending_prices(at_ends).is_empty()
    for past in (
        [(a10, "guaranteed", np.nextafter(low, 0.0), None)],
        [(a100, "guaranteed", np.nextafter(high, 10.0), None)],
    ):
        frame = promise_frame(_book(past), config)
        assert not price_rules(frame).passed
        assert offending_prices(frame)["promise"].to_list() == ["bound"]


def test_a_price_of_an_unknown_pool_does_not_hide_the_prices_after_it(config) -> None:
    """An unknown pool's row fails on its own; every other row is still held to its promises."""
    a10 = "A10@cn-hangzhou-a"
    frame = promise_frame(
        _book([("nowhere", "guaranteed", 1.0, None), (a10, "guaranteed", 9.0, None)]), config
    )
    assert frame["resource"].to_list() == ["nowhere/guaranteed", f"{a10}/guaranteed"]
    assert offending_prices(frame)["resource"].to_list() == ["nowhere/guaranteed", f"{a10}/guaranteed"]


@pytest.mark.parametrize(
    ("factor", "broken"),
    [(0.9, ["band"]), (0.999, ["band"]), (0.8, []), (0.6, []), (0.4, []), (0.39, ["band"])],
)
def test_a_solver_drainable_price_above_its_band_breaks_only_the_band(config, factor, broken) -> None:
    """A10, guaranteed 0.5: the drainable band is 0.2..0.4 (20-60% below). A solver's
    drainable price between (1 - discount_min) x guaranteed and the guaranteed price itself
    is inside every bound and step, yet sells the drainable class too close to the guaranteed
    one: the check fails on the band alone, naming its ends; the band's own ends pass."""
    a10 = "A10@cn-hangzhou-a"
    book = _book([(a10, "guaranteed", 0.5, 0.5), (a10, "drainable", 0.5 * factor, 0.5 * factor)])
    frame = promise_frame(book.with_columns(source=pl.lit("solver")), config)
    offending = offending_prices(frame)
    assert price_rules(frame).passed is (not broken)
    assert offending["promise"].to_list() == broken
    if broken:
        row = offending.row(0, named=True)
        assert row["resource"] == f"{a10}/drainable" and row["price"] == 0.5 * factor
        assert (row["low"], row["high"]) == (pytest.approx(0.2 - 1e-6), pytest.approx(0.4 + 1e-6))


def test_a_drainable_price_without_a_guaranteed_price_beside_it_breaks_the_band(config) -> None:
    """The band hangs from the same pool's guaranteed price: with none published there is no
    price the drainable class may sit at, and the check says so instead of passing it."""
    a10 = "A10@cn-hangzhou-a"
    frame = promise_frame(_book([(a10, "drainable", 0.3, 0.3)]), config)
    assert not price_rules(frame).passed
    assert offending_prices(frame)["promise"].to_list() == ["band"]


@pytest.mark.parametrize(("previous", "price"), [(0.4 / 0.75, 0.45), (0.2 / 1.25, 0.15)])
def test_a_step_that_just_reaches_the_window_stays_the_steps_own(config, previous, price) -> None:
    """A10, guaranteed 0.5 (drainable band 0.2..0.4, step 25%): from 0.4 / 0.75 the step
    reaches down exactly to the band's top, from 0.2 / 1.25 up exactly to its bottom. The
    step can reach the window, so its own ends stand: a price past the band but inside the
    step breaks the band alone, and the operator's table does not name the step."""
    a10 = "A10@cn-hangzhou-a"
    frame = promise_frame(_book([(a10, "guaranteed", 0.5, 0.5), (a10, "drainable", price, previous)]), config)
    drainable = frame.row(1, named=True)
    down, up = previous * 0.75, previous * 1.25
    assert drainable["step_low"] == pytest.approx(down - 1e-6) and drainable["step_high"] == pytest.approx(
        up + 1e-6
    )
    assert offending_prices(frame)["promise"].to_list() == ["band"]


def test_a_broken_price_promise_is_named_by_its_rule_and_the_columns_it_compares(config) -> None:
    """The check's summary and table name each failed rule with the columns it compares, as
    the price book spells them: a guaranteed A10 price under price_min (0.3) fails the price
    against its bound's bottom, one over the cap (0.728) its bound's top against the price,
    and a missing price fails the not-null rule on `price`."""
    a10 = "A10@cn-hangzhou-a"
    pair = "expect_column_pair_values_a_to_be_greater_than_b"
    for price, failed in (
        (0.2, [(pair, "price,bound_low")]),
        (5.0, [(pair, "bound_high,price")]),
    ):
        report = price_rules(promise_frame(_book([(a10, "guaranteed", price, None)]), config))
        assert [(r.expectation, r.column) for r in report.failed] == failed
        assert [r.column for r in report.rules] == [
            "price",
            "price,bound_low",
            "bound_high,price",
            "price,band_low",
            "band_high,price",
            "price,step_low",
            "step_high,price",
        ]
    missing = price_rules(promise_frame(_book([(a10, "guaranteed", None, None)]), config))
    assert ("expect_column_values_to_not_be_null", "price") in [
        (r.expectation, r.column) for r in missing.failed
    ]


@pytest.mark.parametrize(
    "ahead",
    [("A10@cn-hangzhou-a", "guaranteed", 0.5, None), ("nowhere", "guaranteed", 1.0, None)],
    ids=["first-publications", "unknown-pools"],
)
def test_a_price_after_a_hundred_others_is_held_to_every_promise(config, ahead) -> None:
    """A long book is checked to its last row: after a hundred prices published for the first
    time (no price in force) or of unknown pools (no band, no step), an A10 drainable price
    of 0.45 stepping from 0.45 under a guaranteed 0.5 (band 0.2..0.4) still breaks its band."""
    a10 = "A10@cn-hangzhou-a"
    frame = promise_frame(
        _book([ahead] * 100 + [(a10, "guaranteed", 0.5, 0.5), (a10, "drainable", 0.45, 0.45)]), config
    )
    offending = offending_prices(frame)
    last = offending.filter(pl.col("resource") == f"{a10}/drainable")
    assert last["promise"].to_list() == ["band"]
    assert (last["low"][0], last["high"][0]) == (pytest.approx(0.2 - 1e-6), pytest.approx(0.4 + 1e-6))


def test_an_empty_price_book_names_no_broken_promise(config) -> None:
    """Before the first publication there is nothing to break: the operator's table is empty."""
    frame = promise_frame(_book([]), config)
    assert frame.is_empty() and offending_prices(frame).is_empty()
