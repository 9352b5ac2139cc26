"""Pool economics: powered, sold and idle GPU-hours, capacity cost, margin, and the tenants'
idle-cost allocation (proportional or an __idle__ line)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import polars as pl
import pytest
from billing_testkit import A10, A100, H800, T0

from market_pipeline.billing.dbt_project import billing_vars, config_vars, run_dbt
from market_pipeline.billing.rate_card import refresh_rate_card
from market_pipeline.config import ConfigError, MarketPipelineConfig, load_config

ECONOMICS = ["build", "--select", "agg_pool_economics+", "--exclude-resource-type", "unit_test"]


def snapshots(rows):
    """pool_demand_snapshots rows from (minutes after T0, pool, gpus_on)."""
    return pl.DataFrame(
        [
            {
                "ts": T0 + dt.timedelta(minutes=m),
                "pool_id": p,
                "running_gpus": 0.0,
                "pending_gpus": 0.0,
                "gpus_on": g,
            }
            for m, p, g in rows
        ],
        schema_overrides={"gpus_on": pl.Int32},
    )


def hour_row(warehouse, pool, hour=T0):
    return warehouse.query(
        "SELECT * FROM agg_pool_economics WHERE period_grain = 'hour' AND pool_id = ? AND period_start = ?",
        [pool, hour],
    ).row(0, named=True)


@pytest.fixture()
def observed(warehouse_copy):
    # A100: 8 GPUs on 09:00-09:30, 4 from 09:30 (held 60 min at most, to 10:30); the fleet's
    # latest snapshot (the A10 pool at 11:00) is its present: nothing is counted after it
    warehouse_copy.append("pool_demand_snapshots", snapshots([(0, A100, 8), (30, A100, 4), (120, A10, 4)]))
    run_dbt(ECONOMICS, warehouse_copy.path)
    return warehouse_copy


def test_economics_prices_the_observed_powered_capacity(observed, billing_config):
    row = hour_row(observed, A100)
    sold = observed.query(
        "SELECT sum(consumed_gpu_hours) FROM fct_invoice_lines WHERE period_grain = 'hour'"
        " AND pool_id = ? AND period_start = ? AND charge_category = 'Usage'",
        [A100, T0],
    ).item()
    assert row["observed_gpu_hours"] == row["powered_gpu_hours"] == Decimal("6")  # 8 x 0.5 h + 4 x 0.5 h
    assert row["sold_gpu_hours"] == sold == row["sold_guaranteed_gpu_hours"] + row["sold_drainable_gpu_hours"]
    assert row["sold_drainable_gpu_hours"] > 0 and row["idle_gpu_hours"] == Decimal("6") - sold
    rate = Decimal(str(billing_config.gpu_model_by_name["A100-80GB"].cost_per_gpu_hour))
    assert row["capacity_cost"] == (Decimal("6") * rate).quantize(Decimal("1e-9"))
    assert row["margin"] == row["revenue"] - row["capacity_cost"]
    assert row["utilisation"] == (sold / Decimal("6")).quantize(Decimal("1e-6"))
    later = hour_row(observed, A100, T0 + dt.timedelta(hours=1))
    assert later["observed_gpu_hours"] == Decimal("2")  # the 09:30 snapshot holds until 10:30
    present = observed.query(
        "SELECT count(*) FROM agg_pool_economics WHERE pool_id = ? AND period_start >= ?",
        [A10, T0 + dt.timedelta(hours=2)],
    ).item()
    assert present == 0


def test_economics_counts_billed_use_the_snapshots_missed_as_powered(observed):
    fault = hour_row(observed, H800)  # no snapshot of the H800 pool: what was sold was powered
    assert fault["observed_gpu_hours"] == 0 and fault["powered_gpu_hours"] == fault["sold_gpu_hours"] > 0
    assert fault["unobserved_gpu_hours"] == fault["sold_gpu_hours"] and fault["idle_gpu_hours"] == 0
    assert fault["revenue"] < fault["usage_revenue"]  # the SLA credit is netted
    totals = observed.query(
        "SELECT period_grain, sum(revenue) AS r, sum(margin) AS m, sum(capacity_cost) AS c"
        " FROM agg_pool_economics GROUP BY 1 ORDER BY 1"
    ).rows()
    invoice = observed.query(
        "SELECT sum(billed_cost) FROM fct_invoice_lines WHERE period_grain = 'hour'"
    ).item()
    (_, day_r, day_m, day_c), (_, hour_r, hour_m, hour_c) = totals
    assert day_r == hour_r == invoice and day_m == hour_m == hour_r - hour_c and day_c == hour_c


def test_idle_cost_is_shared_by_use_by_default(observed):
    row = hour_row(observed, A100)
    lines = observed.query(
        "SELECT * FROM agg_tenant_capacity_cost WHERE period_grain = 'hour' AND pool_id = ?"
        " AND period_start = ? ORDER BY tenant_id",
        [A100, T0],
    )
    assert set(lines["tenant_id"]) == {"acme-research", "blue-inference"}  # no __idle__ line
    assert sum(lines["allocated_capacity_cost"]) == row["capacity_cost"]
    for line in lines.iter_rows(named=True):
        share = row["capacity_cost"] * line["sold_gpu_hours"] / row["sold_gpu_hours"]
        assert abs(line["allocated_capacity_cost"] - share) <= Decimal("1e-9") * 2
        assert line["idle_cost_share"] > 0 and line["idle_cost_allocation"] == "proportional"


def test_idle_line_mode_books_idle_capacity_to_one_line(observed):
    run_dbt(
        ["run", "--select", "agg_tenant_capacity_cost"],
        observed.path,
        dbt_vars={"idle_cost_allocation": "idle_line"},
    )
    row = hour_row(observed, A100)
    lines = {
        r["tenant_id"]: r
        for r in observed.query(
            "SELECT * FROM agg_tenant_capacity_cost WHERE period_grain = 'hour' AND pool_id = ? AND period_start = ?",
            [A100, T0],
        ).iter_rows(named=True)
    }
    idle = lines.pop("__idle__")
    assert all(r["idle_cost_share"] == 0 for r in lines.values())
    assert idle["allocated_capacity_cost"] == row["capacity_cost"] - sum(
        r["used_capacity_cost"] for r in lines.values()
    )
    rate = row["cost_per_gpu_hour"]
    assert idle["allocated_capacity_cost"] == pytest.approx(row["idle_gpu_hours"] * rate, abs=Decimal("1e-8"))
    assert idle["idle_cost_allocation"] == "idle_line"


def test_idle_cost_allocation_is_a_validated_config_key_passed_as_a_dbt_var():
    config = load_config(environ={"MP__BILLING__IDLE_COST_ALLOCATION": "idle_line"})
    assert config_vars(config) == {"idle_cost_allocation": "idle_line"}
    assert billing_vars(config, T0, T0 + dt.timedelta(hours=1))["min_date"] == T0.isoformat()
    assert load_config().billing.idle_cost_allocation == "proportional"
    with pytest.raises(ConfigError, match="idle_cost_allocation"):
        load_config(environ={"MP__BILLING__IDLE_COST_ALLOCATION": "evenly"})


def test_capacity_cost_per_gpu_hour_comes_from_the_config(observed, billing_config):
    raw = billing_config.model_dump()
    for model in raw["gpu_models"]:
        if model["name"] == "A100-80GB":
            model["cost_per_gpu_hour"] = 2.5
    refresh_rate_card(observed, MarketPipelineConfig.model_validate(raw))
    run_dbt(ECONOMICS, observed.path)
    row = hour_row(observed, A100)
    assert row["cost_per_gpu_hour"] == Decimal("2.5") and row["capacity_cost"] == Decimal("15")
