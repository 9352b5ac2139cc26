"""The refit asset materialises through Dagster and shows the operator its view."""

from __future__ import annotations

import dagster as dg
import pytest


@pytest.fixture
def project_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    return tmp_path


def test_refit_asset_writes_a_row_per_pool_and_class_and_its_metadata(project_home):
    from assets.demand_response.assets import demand_response
    from assets.demand_response.schedules import demand_response_schedule_for
    from assets.lib.resources import FleetAdapterResource, WarehouseResource
    from market_pipeline.config import load_config
    from market_pipeline.warehouse import Warehouse

    config = load_config()
    result = dg.materialize(
        [demand_response],
        resources={
            "fleet": FleetAdapterResource(),
            "warehouse": WarehouseResource(path=str(config.warehouse_path)),
        },
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    store = Warehouse(config.warehouse_path)
    rows = store.query("SELECT * FROM demand_response")
    assert rows.height == 2 * len(config.pools)
    # no sold hours yet: the claims, and every experiment running to learn
    assert (rows["method"] == "prior").all() and (rows["experiment"] == "running").all()
    metadata = result.asset_materializations_for_node("demand_response")[0].metadata
    assert metadata["dagster/row_count"].value == rows.height
    assert {
        "elasticity",
        "experiments",
        "experiments_running",
        "experiments_cost",
        "elasticity_over_time",
    } <= set(metadata)
    assert demand_response_schedule_for(config.demand_response).cron_schedule == "0 */1 * * *"


def test_the_refit_is_not_part_of_every_control_tick():
    from sensors.definitions import defs

    job = defs.resolve_job_def("control_loop_job")
    assert dg.AssetKey("demand_response") not in job.asset_layer.selected_asset_keys
    assert dg.AssetKey("equilibrium_prices") in job.asset_layer.selected_asset_keys
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("demand_response")).pools == {"warehouse"}
