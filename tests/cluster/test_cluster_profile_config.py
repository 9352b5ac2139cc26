"""The profile is chosen by config alone: the shipped config is the embedded default (DuckDB
file, in-process steps); `[warehouse] backend = "ducklake"` and `[orchestration] executor =
"celery"` switch the warehouse and the executor, and a lake without its catalog is refused."""

from __future__ import annotations

import dagster as dg
import pytest

from market_pipeline.config import ConfigError, load_config


def test_the_shipped_config_is_the_embedded_default():
    from sensors.definitions import executor_for

    config = load_config(environ={})
    assert config.warehouse.backend == "duckdb" and config.orchestration.executor == "in_process"
    assert executor_for(config) is dg.in_process_executor
    assert str(config.warehouse_path).endswith("var/warehouse.duckdb")


def test_the_cluster_profile_sends_steps_to_celery_with_the_configured_broker():
    from sensors.definitions import executor_for

    config = load_config(
        environ={
            "MP__ORCHESTRATION__EXECUTOR": "celery",
            "MP__ORCHESTRATION__CELERY_BROKER": "redis://127.0.0.1:6379/0",
        }
    )
    executor = executor_for(config)
    assert executor.name == "celery"
    resolved = executor.config_schema.resolve_config({}).value["config"]
    assert resolved["broker"] == "redis://127.0.0.1:6379/0" and resolved["backend"] == "rpc://"
    # a step's message stays with the broker until the step ends (a dead worker's goes to another)
    assert resolved["config_source"] == {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_default_queue": "dagster",
    }


def test_a_lake_without_its_catalog_is_one_clear_error():
    with pytest.raises(ConfigError, match="catalog_url"):
        load_config(environ={"MP__WAREHOUSE__BACKEND": "ducklake"})


def test_on_a_lake_the_billing_build_has_a_pool_of_its_own():
    from assets.billing.dbt import BILLING_DBT_POOL, billing_dbt_models, billing_dbt_pool

    embedded = load_config(environ={})
    lake = load_config(
        environ={"MP__WAREHOUSE__BACKEND": "ducklake", "MP__WAREHOUSE__CATALOG_URL": "host=db1 dbname=lake"}
    )
    assert billing_dbt_pool(embedded) == "warehouse"  # the one writer of the DuckDB file
    assert billing_dbt_pool(lake) == BILLING_DBT_POOL
    models = billing_dbt_models(billing_dbt_pool(lake))
    assert {models.get_op_def_for_asset_key(key).pool for key in models.keys} == {BILLING_DBT_POOL}
