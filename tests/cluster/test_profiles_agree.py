"""The same slice of the loop on both profiles gives the same results, to the row: one metered
hour (telemetry, metering, the rate card) and one control tick (prices, the price book, scaling
and drain decisions), with the same seed and epoch, once on the embedded default (one DuckDB
file) and once on the cluster profile (DuckLake, the control state and the twin in
PostgreSQL), both through Dagster. The invoices the dbt
build makes from metered usage are compared on both backends, to the cent, in
tests/billing/test_billing_on_lake.py (the whole dbt build through Dagster on a lake takes
minutes on the shared CI cores)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from market_pipeline.warehouse import Lake, Warehouse

EPOCH = "2026-11-02T00:00:00Z"
EPOCH_AT = dt.datetime(2026, 11, 2, tzinfo=dt.timezone.utc)
SLICE = ["telemetry_samples", "usage_intervals", "billing_rate_card"]
TICK_GROUPS = ("fleet", "market", "scaling", "drain")


def _run_slice(home: Path, env: dict[str, str]) -> Warehouse:
    from assets.lib.resources import FleetAdapterResource, WarehouseResource
    from assets.lib.tags import TICK_TAG
    from market_pipeline.config import load_config
    from sensors.definitions import defs

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARKET_PIPELINE_HOME", str(home))
        patch.setenv("MP__ADAPTER__SIM_EPOCH", EPOCH)
        for key, value in env.items():
            patch.setenv(key, value)
        config = load_config()
        warehouse = WarehouseResource.from_config(config)
        resources = {**defs.resources, "fleet": FleetAdapterResource(), "warehouse": warehouse}
        assets = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)]
        with dg.DagsterInstance.ephemeral() as instance:
            billed = dg.materialize(
                assets,
                selection=dg.AssetSelection.assets(*SLICE),
                partition_key=EPOCH_AT.strftime("%Y-%m-%d-%H:%M"),
                resources=resources,
                instance=instance,
            )
            assert billed.success
            tick = dg.materialize(
                assets,
                selection=dg.AssetSelection.groups(*TICK_GROUPS),
                resources=resources,
                instance=instance,
                tags={TICK_TAG: (EPOCH_AT + dt.timedelta(hours=1)).isoformat()},
            )
            assert tick.success
        return warehouse.reader()


def _results(store: Warehouse) -> dict[str, list[tuple]]:
    return {
        "rate_card": store.query(
            "SELECT pool_id, base_price_per_gpu_hour FROM billing_rate_card_pools ORDER BY 1"
        ).rows(),
        "telemetry": store.query(
            "SELECT partition_key, count(*), sum(power_w) FROM telemetry_clean GROUP BY 1 ORDER BY 1"
        ).rows(),
        "price_book": store.query(
            "SELECT effective_from, pool_id, resource_class, price_per_gpu_hour, source FROM price_book "
            "ORDER BY 1, 2, 3"
        ).rows(),
        "decisions": store.query(
            # a drain request is stamped with the wall clock when it is made (on both profiles)
            "SELECT decision_id, kind, pool_id, target, action, allowed, shadow, reasons, "
            "CASE WHEN kind = 'drain' THEN NULL ELSE decided_at END AS decided_at FROM decisions ORDER BY 1"
        ).rows(),
        "usage": store.query(
            "SELECT interval_id, tenant_id, started_at, ended_at, gpu_fraction FROM usage_intervals ORDER BY 1"
        ).rows(),
    }


@pytest.mark.postgres
@pytest.mark.slow
def test_the_cluster_profile_bills_prices_and_decides_what_the_embedded_default_does(
    migrated_lake: Lake, tmp_path: Path
):
    embedded = _results(_run_slice(tmp_path / "embedded", {}))
    on_lake = _results(
        _run_slice(
            tmp_path / "cluster",
            {
                "MP__WAREHOUSE__BACKEND": "ducklake",
                "MP__WAREHOUSE__CATALOG_URL": migrated_lake.catalog,
                "MP__WAREHOUSE__DATA_PATH": migrated_lake.data_path,
                # the control state and the twin in the catalog's PostgreSQL
                "MP__CONTROL__BACKEND": "postgres",
                "MP__ADAPTER__STATE_STORE": "control",
            },
        )
    )
    assert embedded["telemetry"] and embedded["price_book"] and embedded["decisions"] and embedded["usage"]
    for name, rows in embedded.items():
        assert on_lake[name] == rows, name
    assert not (tmp_path / "cluster" / "var" / "warehouse.duckdb").exists()  # the lake took every write
    assert not (tmp_path / "cluster" / "var" / "fleet_state.json").exists()  # the twin is in PostgreSQL
