"""The warehouse's typed owners: one DecisionRow schema for the four kinds of decision, the
readers and writers the assets go through."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import polars as pl

from market_pipeline.billing.balances import GuardVerdict, guard_decisions
from market_pipeline.config import load_config
from market_pipeline.drain.plan import decisions_frame as drain_frame
from market_pipeline.scaling.live import decision_rows as scale_rows
from market_pipeline.scaling.types import ScalingDecision
from market_pipeline.tick.live import base_price_rows
from market_pipeline.tick.state import shadow_price_decisions
from market_pipeline.warehouse import open_warehouse, readers, writers
from market_pipeline.warehouse.decision_inputs import ScaleInputs
from market_pipeline.warehouse.decisions import DECISION_SCHEMA

NOW = datetime(2026, 11, 3, 5, 0, tzinfo=UTC)


def _scale() -> pl.DataFrame:
    decision = ScalingDecision(
        decision_id="d1",
        pool="p1",
        action="scale_up",
        node_id=None,
        allowed=True,
        reasons=["forecast q90 above capacity"],
        inputs=ScaleInputs(
            *(1.0, 2.0, 3.0, 0.0),  # forecast q90, price, demand, backlog
            *(4, 4, 4, 1, 4),  # target, need, keep, keep band, demand need (nodes)
            *(1.0, 3.0),  # demand step, wanted GPUs
            *(3, 1, 0, 0, 0, 1, 8),  # schedulable ... warming, floor, max (nodes)
            target_certified=True,
            target_shield=("certified",),
        ).with_facts(to="standby"),
        certificate_margin=0.5,
        decided_at=NOW.isoformat(),
        count=2,
    )
    return scale_rows([decision], shadow=True, decided_at=NOW)


def _budget() -> pl.DataFrame:
    verdict = GuardVerdict(
        "t1",
        admit_new_tasks=False,
        drain_running=True,
        drain_after=NOW,
        balance=Decimal("-1"),
        available=None,
        next_interval_cost=Decimal("2"),
        reasons=("balance below zero",),
    )
    return guard_decisions([verdict], {"t1": [("task-1", "p1")]}, NOW, shadow=False)


def _price() -> pl.DataFrame:
    rows = base_price_rows(load_config(), NOW).with_columns(pl.lit("solve-1").alias("solve_id"))
    return shadow_price_decisions(rows, NOW)


def test_every_kind_of_decision_has_the_one_schema_and_lands_in_the_table(tmp_path):
    frames = {"scale": _scale(), "budget_guard": _budget(), "price": _price(), "drain": drain_frame([])}
    for kind, frame in frames.items():
        assert frame.schema == pl.Schema(DECISION_SCHEMA), kind
    store = open_warehouse(tmp_path / "w.duckdb")
    for frame in frames.values():
        writers.record_decisions(store, frame)
    stored = store.query(
        "SELECT kind, count(*) AS n, bool_and(inputs IS NOT NULL) AS has_inputs "
        "FROM decisions GROUP BY kind ORDER BY kind"
    )
    assert stored["kind"].to_list() == ["budget_guard", "price", "scale"]
    assert stored["n"].to_list() == [2, frames["price"].height, 1] and stored["has_inputs"].all()
    scale = store.query(
        "SELECT reasons, CAST(inputs AS VARCHAR) AS inputs FROM decisions WHERE kind = 'scale'"
    )
    assert scale["reasons"][0].to_list() == [
        "forecast q90 above capacity",
        "shadow mode: recorded, not executed",
    ]
    assert scale["inputs"][0].endswith(
        '"target_shield": ["certified"], "to": "standby", "count": 2, "certificate_margin": 0.5}'
    )  # the tick's inputs, the decision's facts, then what it was recorded with


def test_prices_written_and_read_back_by_their_owners(tmp_path):
    store = open_warehouse(tmp_path / "w.duckdb")
    config = load_config()
    assert readers.price_book_is_empty(store)
    writers.append_prices(store, base_price_rows(config, NOW - timedelta(hours=1)))
    later = base_price_rows(config, NOW).with_columns(pl.col("price_per_gpu_hour") * 2)
    writers.publish_prices(store, later)
    writers.publish_prices(store, later)  # a rerun of the tick replaces, never doubles
    history = readers.price_history(store, NOW - timedelta(hours=2))
    assert history.height == 2 * later.height and history["price"].dtype == pl.Float64
    booked = readers.last_certified_prices(store)
    first = later.row(0, named=True)
    assert booked[f"{first['pool_id']}/{first['resource_class']}"] == float(first["price_per_gpu_hour"])
    assert readers.latest_tick(store, NOW).is_empty() and readers.latest_tick_at(store) is None
