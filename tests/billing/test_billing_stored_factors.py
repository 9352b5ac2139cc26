"""Rated usage is computed on read from the factors stored when each hour was rated: later
rate-card or price-book changes must not re-rate a rated hour, usage of an hour not rated
yet must not appear as rated, and only re-rating the window applies new prices."""

from __future__ import annotations

import duckdb
from billing_testkit import HOURS, T0, rate_hours


def _rated(warehouse) -> dict:
    row = warehouse.query(
        "SELECT count(*) AS n, sum(billed_seconds) AS s, sum(billed_cost) AS c,"
        " sum(base_cost + time_premium + location_premium + drainability_discount"
        " + commitment_discount) AS parts FROM fct_rated_usage"
    ).row(0, named=True)
    usage = warehouse.query(
        "SELECT sum(billed_cost) FROM fct_invoice_lines"
        " WHERE period_grain = 'hour' AND charge_category = 'Usage'"
    ).item()
    return {**row, "invoice_usage": usage}


def test_rate_card_changes_do_not_rerate_rated_hours(warehouse_copy):
    before = _rated(warehouse_copy)
    assert before["c"] == before["parts"] == before["invoice_usage"] and before["n"] > 0
    with duckdb.connect(str(warehouse_copy.path)) as con:
        con.execute("UPDATE billing_rate_card_zones SET location_coefficient = location_coefficient * 2")
        con.execute("UPDATE billing_rate_card_time SET coefficient = 3")
        con.execute("UPDATE billing_commitment_tiers SET discount = 0.5")
        # a price published late, effective from before the rated hours
        con.execute(
            "INSERT INTO price_book BY NAME SELECT effective_from - INTERVAL 1 DAY AS effective_from, pool_id,"
            " gpu_model, zone, resource_class, price_per_gpu_hour * 10 AS price_per_gpu_hour,"
            " 'late' AS solve_id, source FROM price_book"
        )
        # usage of an hour that was not rated yet
        con.execute(
            "INSERT INTO usage_intervals SELECT 'late-' || interval_id, task_id, tenant_id, pool_id,"
            " gpu_model, zone, resource_class, node_id, gpu_uuid, gpu_fraction, mig_profile, mem_mib,"
            " started_at + INTERVAL 3 HOUR, ended_at + INTERVAL 3 HOUR, end_reason, drain_signal_at,"
            " false, partition_key FROM usage_intervals"
        )
    assert _rated(warehouse_copy) == before  # nothing re-rated, nothing unrated shows up

    rate_hours(warehouse_copy, [HOURS[0]], command="run")  # re-rating a window applies the new card
    after = _rated(warehouse_copy)
    assert after["c"] == after["parts"] == after["invoice_usage"]
    coefficients = warehouse_copy.query(
        "SELECT usage_hour = ? AS rerated, min(time_coefficient) AS lo, max(time_coefficient) AS hi"
        " FROM fct_rated_usage GROUP BY 1 ORDER BY 1",
        [T0.replace(tzinfo=None)],
    ).rows()
    assert coefficients[1][1:] == (3, 3) and coefficients[0][2] < 3  # only 09:00 took the new card
    assert after["c"] > before["c"]
