"""The Dagster code location: workspace.yaml agrees with the definitions module, and the
first slice (telemetry -> usage intervals -> dbt staging) materialises on SQLite and on the
real PostgreSQL server."""

import tomllib
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]

SLICE = [
    "telemetry_samples",
    "usage_intervals",
    "billing_rate_card",
    "stg_usage_intervals",
    "fct_invoice_lines",
]
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def test_workspace_yaml_points_at_the_definitions_module():
    workspace = yaml.safe_load((REPO_ROOT / "workspace.yaml").read_text())
    [location] = workspace["load_from"]
    assert location["python_file"]["relative_path"] == "sensors/definitions.py"
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    # Dagster would prefer these over workspace.yaml; workspace.yaml stays the single source.
    assert "dagster" not in pyproject.get("tool", {}) and "dg" not in pyproject.get("tool", {})

    from sensors.definitions import defs

    repo = defs.get_repository_def()
    assert {"telemetry_job", "control_loop_job", "drain_job", "scaling_actions_job", "billing_job"} <= set(
        repo.job_names
    )
    assert {"drain_sensor", "scaling_sensor"} <= {s.name for s in repo.sensor_defs}
    keys = {key.to_user_string() for key in repo.asset_graph.get_all_asset_keys()}
    for name in (
        "telemetry_samples",
        "usage_intervals",
        "demand_forecast",
        "equilibrium_prices",
        "price_book",
        "scaling_plan",
        "drain_requests",
        "fct_invoice_lines",
        "focus_export",
    ):
        assert name in keys


def test_workspace_resolves_to_its_own_checkout_from_any_folder(tmp_path, monkeypatch):
    """`make ui` / `make up` start Dagster in var/...: the code location must still be this
    checkout's files (not whatever an editable install or the process's folder points at)."""
    from dagster._core.workspace.load import location_origins_from_yaml_paths

    monkeypatch.chdir(tmp_path)
    [origin] = location_origins_from_yaml_paths([str(REPO_ROOT / "workspace.yaml")])
    target = origin.loadable_target_origin
    assert origin.location_name == "market_pipeline"
    assert Path(target.python_file) == REPO_ROOT / "sensors" / "definitions.py"
    assert Path(target.working_directory) == REPO_ROOT


def test_writers_take_the_warehouse_pool():
    from sensors.definitions import defs

    graph = defs.get_repository_def().asset_graph
    writers = [
        "telemetry_samples",
        "usage_intervals",
        "price_book",
        "equilibrium_prices",
        "scaling_plan",
        "drain_requests",
        "fct_invoice_lines",
    ]
    for name in writers:
        node = graph.get(dg.AssetKey(name))
        assert node.pools == {"warehouse"}, name


@pytest.fixture
def project_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    return tmp_path


def _materialise_slice(instance: dg.DagsterInstance, home: Path, with_dbt: bool = True) -> str:
    from assets.billing.dbt import billing_dbt_models
    from assets.lib.resources import FleetAdapterResource, WarehouseResource
    from market_pipeline.config import load_config
    from sensors.definitions import defs

    config = load_config()
    fleet = FleetAdapterResource()
    partition = fleet.get().epoch_time().strftime("%Y-%m-%d-%H:%M")
    resources = {
        **defs.resources,
        "fleet": fleet,
        "warehouse": WarehouseResource(path=str(config.warehouse_path)),
    }
    result = dg.materialize(
        [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)],
        selection=(
            dg.AssetSelection.assets(*SLICE[:3]) | dg.AssetSelection.assets(billing_dbt_models())
            if with_dbt
            else dg.AssetSelection.assets(*SLICE[:2])
        ),
        partition_key=partition,
        resources=resources,
        instance=instance,
    )
    assert result.success
    return partition


def _assert_slice_landed(
    instance: dg.DagsterInstance, home: Path, partition: str, with_dbt: bool = True
) -> None:
    from market_pipeline.warehouse import Warehouse

    for name in SLICE if with_dbt else SLICE[:2]:
        event = instance.get_latest_materialization_event(dg.AssetKey(name))
        assert event is not None, name
    store = Warehouse(home / "var" / "warehouse.duckdb")
    clean = store.query("SELECT count(*) AS n FROM telemetry_clean WHERE partition_key = ?", [partition])[
        "n"
    ][0]
    metered = store.query("SELECT count(*) AS n FROM usage_intervals")["n"][0]
    assert clean > 0 and metered > 0
    if with_dbt:
        staged = store.query("SELECT count(*) AS n, sum(metered_seconds) AS s FROM stg_usage_intervals").row(
            0
        )
        assert staged[0] == metered and staged[1] > 0


@pytest.mark.slow
def test_slice_on_sqlite_storage(project_home, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "SqliteRunStorage"
        partition = _materialise_slice(instance, project_home)
        _assert_slice_landed(instance, project_home, partition)


@pytest.mark.postgres
def test_slice_on_postgres_storage(project_home, tmp_path):
    psycopg2 = pytest.importorskip("psycopg2")
    database = f"dagster_test_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(PG_ADMIN_URL)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {database}")
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}"
    home = tmp_path / "dagster_home_pg"
    home.mkdir()
    shipped = (REPO_ROOT / "market_pipeline" / "defaults" / "dagster.postgres.yaml").read_text()
    (home / "dagster.yaml").write_text(shipped)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("DAGSTER_PG_URL", url)
            with dg.DagsterInstance.from_config(str(home)) as instance:
                assert type(instance.run_storage).__name__ == "PostgresRunStorage"
                # The dbt step is storage-independent and covered on SQLite above.
                partition = _materialise_slice(instance, project_home, with_dbt=False)
                _assert_slice_landed(instance, project_home, partition, with_dbt=False)
        check = psycopg2.connect(url.replace("+psycopg2", ""))
        with check, check.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM runs")
            assert cursor.fetchone()[0] >= 1
        check.close()
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()
