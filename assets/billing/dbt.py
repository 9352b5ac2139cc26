"""The dbt billing marts as Dagster assets (hourly windows, dbt tests as asset checks).

Nothing here runs at import: the dbt project is a cached factory that parses the manifest
when it is missing or older than the project, and the assets and the dbt resource are built
from it when the definitions are composed (sensors/definitions.py).
"""

import functools
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
    dbt_assets,
)

from assets.lib.metadata import ROW_COUNT
from assets.lib.partitions import HOURLY_PARTITIONS, SINGLE_RUN
from assets.lib.resources import FleetAdapterResource, WarehouseResource
from market_pipeline.billing.dbt_metadata import dbt_test_description, model_description, row_counts
from market_pipeline.billing.dbt_project import (
    DBT_PROJECT_DIR,
    UNIT_TESTS_EXCLUDED,
    WAREHOUSE_ENV,
    billing_vars,
    ensure_manifest,
    environment_overrides,
)
from market_pipeline.config import ConfigError, MarketPipelineConfig, load_config
from market_pipeline.warehouse.lake import DBT_TARGET as LAKE_DBT_TARGET

GROUP = "billing"  # with the billing assets (assets.py): billing_job selects the group


def _configured_warehouse() -> Path | None:
    try:
        return load_config().warehouse_path
    except ConfigError:  # reported where the config is used; parsing does not need it
        return None


@functools.cache
def billing_dbt_project() -> DbtProject:
    """The dbt project with a current manifest. `ensure_manifest` plays the part of
    `DbtProject.prepare_if_dev()` for every loader, not only `dagster dev` (the demo's daemon
    and the tests load the code location without it): it parses when the manifest is missing
    or older than the project, into a scratch dir moved into place (concurrent code servers
    never read a half-written one), for the configured warehouse (the runs' dbt subprocesses
    then reuse the partial parse)."""
    ensure_manifest(DBT_PROJECT_DIR, _configured_warehouse())
    return DbtProject(project_dir=DBT_PROJECT_DIR, profiles_dir=DBT_PROJECT_DIR)


class BillingDbtTranslator(DagsterDbtTranslator):
    def get_group_name(self, dbt_resource_props: dict[str, Any]) -> str | None:
        return GROUP

    def get_description(self, dbt_resource_props: Mapping[str, Any]) -> str:
        """The model's own description (dbt/models/**.yml), not its raw SQL."""
        return model_description(dbt_resource_props)

    def get_asset_check_spec(
        self,
        asset_spec: dg.AssetSpec,
        manifest: Mapping[str, Any],
        unique_id: str,
        project: DbtProject | None,
    ) -> dg.AssetCheckSpec | None:
        spec = super().get_asset_check_spec(asset_spec, manifest, unique_id, project)
        if spec is None:
            return None
        node = manifest["nodes"].get(unique_id, {})
        return spec._replace(description=dbt_test_description(node))


BILLING_DBT_POOL = "billing_dbt"  # `make cluster-up` sets its limit to 1


def billing_dbt_pool(config: MarketPipelineConfig) -> str:
    """The pool of the billing dbt build: the one-writer `warehouse` pool of the embedded default;
    on a lake (no `warehouse` limit) a pool of its own, so that two builds never run at once."""
    return "warehouse" if config.warehouse.backend == "duckdb" else BILLING_DBT_POOL


@functools.cache
def billing_dbt_models(pool: str = "warehouse") -> dg.AssetsDefinition:
    """The dbt models of the billing marts, one asset each, their tests as asset checks, in
    `pool` (the embedded default's one-writer `warehouse`; on the cluster profile a pool of
    their own, `billing_dbt`, limited to 1: two dbt builds at once on a lake rename relations
    over each other and fail)."""
    project = billing_dbt_project()
    translator = BillingDbtTranslator(
        settings=DagsterDbtTranslatorSettings(
            enable_asset_checks=True, enable_duplicate_source_asset_keys=True
        )
    )

    @dbt_assets(
        manifest=project.manifest_path,
        project=project,
        partitions_def=HOURLY_PARTITIONS,
        backfill_policy=SINGLE_RUN,
        pool=pool,
        dagster_dbt_translator=translator,
        name="billing_dbt_models",
    )
    def models(
        context: dg.AssetExecutionContext,
        dbt: DbtCliResource,
        warehouse: WarehouseResource,
        fleet: FleetAdapterResource,
    ) -> Iterator[Any]:
        """dbt build of the billing marts for the run's hours (window_table: the window's rows
        replaced at once), with the config's billing vars (idle-cost allocation)."""
        window = context.partition_time_window
        dbt_vars = billing_vars(fleet.config(), window.start, window.end)
        # the cluster profile's lake: dbt's `cluster` target, attached under the same name
        lake = warehouse.lake
        env = {WAREHOUSE_ENV: str(Path(warehouse.path).resolve()), **(lake.dbt_environment() if lake else {})}
        target = ["--target", LAKE_DBT_TARGET] if lake else []
        with environment_overrides(env):
            invocation = dbt.cli(
                ["build", *UNIT_TESTS_EXCLUDED, "--vars", json.dumps(dbt_vars), *target], context=context
            )
        yield from with_row_counts(invocation.stream(), warehouse)

    return models


def with_row_counts(events: Iterable[Any], warehouse: WarehouseResource) -> Iterator[Any]:
    """Each model's materialisation with its row count (`dagster/row_count`).

    The equivalent of dagster-dbt's `fetch_row_counts()`, which queries while dbt runs: DuckDB
    lets one process hold the file, so the counts are read once dbt has exited and let go."""
    held = list(events)
    names = {_model_name(e) for e in held if isinstance(e, (dg.Output, dg.AssetMaterialization))}
    counts = row_counts(warehouse.reader(), (n for n in names if n))
    for event in held:
        name = _model_name(event) if isinstance(event, (dg.Output, dg.AssetMaterialization)) else None
        if name in counts:
            event = event.with_metadata({**event.metadata, ROW_COUNT: counts[name]})
        yield event


def _model_name(event: Any) -> str | None:
    unique_id = event.metadata.get("unique_id")
    value = getattr(unique_id, "value", unique_id)
    return str(value).rsplit(".", 1)[-1] if value else None


def dbt_resource() -> DbtCliResource:
    """The dbt CLI next to this interpreter (a venv's bin/ need not be on PATH)."""
    beside = Path(sys.executable).parent / "dbt"
    return DbtCliResource(
        project_dir=billing_dbt_project(), dbt_executable=str(beside) if beside.exists() else "dbt"
    )
