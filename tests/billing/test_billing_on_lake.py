"""The billing dbt project, unchanged, on the cluster profile's DuckLake (dbt-duckdb attaches
`ducklake:postgres:...` under the same catalog name): the same invoices, FOCUS rows, credits
and rated seconds as on the embedded DuckDB file, to the cent and the row."""

from __future__ import annotations

from pathlib import Path

import pytest
from billing_testkit import HOURS, build_scenario, invoice_snapshot, rate_hours, scenario

from market_pipeline.billing.metering import HourWindow
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.warehouse import Lake, Warehouse


@pytest.mark.postgres
def test_dbt_billing_on_the_lake_bills_what_the_embedded_file_bills(
    rated_warehouse: Warehouse, billing_config: MarketPipelineConfig, lake: Lake, tmp_path: Path
):
    on_lake = build_scenario(tmp_path / "unused.duckdb", billing_config, scenario(), lake=lake)
    # one ranged build over both hours (as the billing backfill runs), the file's hour by hour
    rate_hours(on_lake, [HourWindow(HOURS[0].start, HOURS[-1].end)])
    expected = invoice_snapshot(rated_warehouse)
    assert expected["rated_rows"] > 0 and expected["invoice"] and expected["credits"]
    assert invoice_snapshot(on_lake) == expected
    assert not (tmp_path / "unused.duckdb").exists()  # nothing went to a local file
