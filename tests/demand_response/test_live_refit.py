"""The live loop's refit from the warehouse, what the tick reads back, and the experiment rows."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from market_pipeline.config import load_config
from market_pipeline.demand_response.history import warehouse_history
from market_pipeline.demand_response.live import (
    refit_rows,
    run_experiments,
    tick_response,
    tick_response_observed,
)
from market_pipeline.lab.demand_response.synthetic import HistoryParams, synthetic_history
from market_pipeline.lab.demand_response.truth import grid_market
from market_pipeline.lab.demand_response.truth_grid import pool_inputs
from market_pipeline.market.problem import MarketProblem
from market_pipeline.tick import Promises, run_market_tick
from market_pipeline.warehouse import open_warehouse


def _load(store, config, frame: pl.DataFrame) -> None:
    """The history as the loop leaves it: the price in force per hour, GPU-hours sold in it."""
    pool = config.pool_by_id[frame["pool_id"][0]]
    prices, usage = [], []
    for i, row in enumerate(frame.iter_rows(named=True)):
        prices.append(
            {
                "effective_from": row["ts"],
                "pool_id": pool.pool_id,
                "gpu_model": pool.gpu_model,
                "zone": pool.zone,
                "resource_class": row["resource_class"],
                "price_per_gpu_hour": round(row["price"], 6),
                "solve_id": f"s{i}",
                "source": "solver",
            }
        )
        pieces = math.ceil(row["demand"] / 50)
        for k in range(pieces):
            usage.append(
                {
                    "interval_id": f"u{i}-{k}",
                    "task_id": f"t{i}-{k}",
                    "tenant_id": "acme",
                    "pool_id": pool.pool_id,
                    "gpu_model": pool.gpu_model,
                    "zone": pool.zone,
                    "resource_class": row["resource_class"],
                    "node_id": "n1",
                    "gpu_uuid": "g1",
                    "gpu_fraction": round(row["demand"] / pieces, 4),
                    "mem_mib": 1,
                    "started_at": row["ts"],
                    "ended_at": row["ts"] + timedelta(hours=1),
                    "end_reason": "completed",
                    "partition_key": "p",
                }
            )
    store.append(
        "price_book", pl.DataFrame(prices).with_columns(pl.col("price_per_gpu_hour").cast(pl.Decimal(18, 6)))
    )
    store.append(
        "usage_intervals", pl.DataFrame(usage).with_columns(pl.col("gpu_fraction").cast(pl.Decimal(6, 4)))
    )


@pytest.fixture(scope="module")
def refit(tmp_path_factory):
    config = load_config(resolve_fleet=False, environ={})
    store = open_warehouse(tmp_path_factory.mktemp("wh") / "w.duckdb")
    pool_id = config.pools[0].pool_id
    frame = synthetic_history(
        HistoryParams(
            1.5,
            days=14,
            step_minutes=60,
            seed=4,
            pool_id=pool_id,
            resource_class="drainable",
            base_price=config.pools[0].base_price * 0.6,
            cycle=(0.5, 0.5),  # the tenants' response follows the hour: the refit keeps the cycle
        )
    )
    _load(store, config, frame)
    now = frame["ts"].max() + timedelta(hours=1)
    rows = refit_rows(config, store, now)
    store.append("demand_response", rows)
    return config, store, now, pool_id, rows


def test_the_refit_recovers_the_elasticity_from_sold_hours_and_prices(refit):
    config, _, _, pool_id, rows = refit
    assert rows.height == 2 * len(config.pools)
    row = rows.filter((pl.col("pool_id") == pool_id) & (pl.col("resource_class") == "drainable")).row(
        0, named=True
    )
    assert row["method"] == "fe-ols+prior" and row["observations"] == 14 * 24
    assert row["elasticity"] == pytest.approx(1.5, rel=0.15)
    assert row["elasticity_low"] < row["elasticity"] < row["elasticity_high"]
    unfitted = rows.filter(pl.col("observations") == 0)
    assert (unfitted["method"] == "prior").all() and (
        unfitted["elasticity"] == config.market.reference_elasticity
    ).all()


def test_the_tick_reads_the_fit_and_the_running_experiments(refit):
    config, store, now, pool_id, rows = refit
    response, running = tick_response(config, store, now)
    row = rows.filter((pl.col("pool_id") == pool_id) & (pl.col("resource_class") == "drainable")).row(
        0, named=True
    )
    angle = 2 * math.pi * (now.hour + now.minute / 60) / 24  # the elasticity at the tick's hour
    at_hour = (
        row["elasticity"] + row["elasticity_cos"] * math.cos(angle) + row["elasticity_sin"] * math.sin(angle)
    )
    assert row["elasticity_cos"] > 0.1 and row["elasticity_sin"] > 0.1  # the data's cycle, kept (shrunk)
    assert response[f"{pool_id}/drainable"] == pytest.approx(at_hour)
    later, _ = tick_response(config, store, now + timedelta(hours=12))
    assert later[f"{pool_id}/drainable"] != pytest.approx(at_hour)  # twelve hours on: the cycle's other side
    assert set(running) == set(
        (
            rows.filter(pl.col("experiment") == "running").select(
                pl.concat_str("pool_id", "resource_class", separator="/")
            )
        )
        .to_series()
        .to_list()
    )
    assert all(v.endswith(f"@{now:%Y-%m-%dT%H:%MZ}") for v in running.values())
    off = config.model_copy(
        update={"demand_response": config.demand_response.model_copy(update={"enabled": False})}
    )
    assert tick_response(off, store, now) == ({}, {})


def test_the_tick_reads_where_each_fit_observed_demand(refit):
    """The refit stores the low end of the prices it saw (the 10th percentile at the 80% level);
    with `observed_budget` on, the tick reads it back with the elasticity's lower bound (or its
    estimate) at its hour, for fits the data spoke in only (the unfitted pools' prior rows offer
    nothing); off (the default), nothing."""
    config, store, now, pool_id, rows = refit
    assert tick_response_observed(config, store, now)[2] == {}  # the default: off

    def reading(bound):
        dr = config.demand_response.model_copy(update={"observed_budget": bound})
        return tick_response_observed(config.model_copy(update={"demand_response": dr}), store, now)

    response, running, observed = reading("lower_bound")
    assert (response, running) == tick_response(config, store, now)
    key = f"{pool_id}/drainable"
    row = rows.filter((pl.col("pool_id") == pool_id) & (pl.col("resource_class") == "drainable")).row(
        0, named=True
    )
    history = warehouse_history(store, now - timedelta(days=config.demand_response.history_days), now)
    prices = history.filter((pl.col("pool_id") == pool_id) & (pl.col("resource_class") == "drainable"))[
        "price"
    ]
    assert row["price_low"] == pytest.approx(
        float(np.exp(np.quantile(np.log(prices.to_numpy()), 0.1))), rel=1e-9
    )
    angle = 2 * math.pi * (now.hour + now.minute / 60) / 24
    low_at_hour = (
        row["elasticity_low"]
        + row["elasticity_cos"] * math.cos(angle)
        + row["elasticity_sin"] * math.sin(angle)
    )
    assert observed[key] == (pytest.approx(row["price_low"]), pytest.approx(low_at_hour))
    assert set(observed) == {key}  # the other pools' rows are the prior alone
    central = reading("central")[2]
    assert central[key] == (pytest.approx(row["price_low"]), pytest.approx(response[key]))


def test_a_running_experiment_keeps_its_id_across_refits(refit):
    config, store, now, _, rows = refit
    later = refit_rows(config, store, now + timedelta(hours=1))
    before = dict(zip(rows["pool_id"] + "/" + rows["resource_class"], rows["experiment_id"]))
    for r in later.filter(pl.col("experiment") == "running").iter_rows(named=True):
        assert r["experiment_id"] == before[f"{r['pool_id']}/{r['resource_class']}"]


@pytest.mark.parametrize("shadow", [False, True])
def test_experiment_rows_record_the_cost_and_shadow_mode_publishes_nothing(shadow, tmp_path):
    config = load_config(resolve_fleet=False, environ={})
    promises = Promises.from_config(config)
    market = grid_market(promises.discount_min, promises.discount_max)
    pop = market.population(np.array([0.2, 2.0, 0.2, 2.0]), 1.0)
    problem = market.with_capacity(
        MarketProblem(market.resources, pop), market.capacity(market.base_demand[0::2])
    )
    pools = pool_inputs(market, market.reference, market.base_demand, market.base_demand, promises)
    tick = run_market_tick(pools, problem, promises)
    running = {k: f"{k}@t0" for k in market.keys}
    from datetime import datetime, timezone

    now = datetime(2026, 3, 2, 5, tzinfo=timezone.utc)
    published, rows = run_experiments(config, tick, pools, problem, {}, running, now, shadow)
    assert rows.height == 4 and (rows["published"] == (not shadow)).all()
    store = open_warehouse(tmp_path / "w.duckdb")
    assert store.replace_where("price_experiments", "tick_at = ?", [now], rows) == 4
    assert (rows["experiment_id"].str.ends_with("@t0")).all()
    if shadow:
        assert np.array_equal(published.prices(), tick.prices())
    else:
        moved = rows.filter(pl.col("experiment_price") != pl.col("base_price"))
        assert moved.height > 0 and not np.array_equal(published.prices(), tick.prices())
        assert rows["estimated_cost_per_hour"].sum() > -1e-6  # the tick's price is the model's best
