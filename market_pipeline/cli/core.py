"""Core subcommands: `sql` (finance's read-only entry point), `migrate`, `config`."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
from collections.abc import Callable

from market_pipeline.cli.support import input_error, number
from market_pipeline.cli.warehouse_options import (
    add_limit_arguments,
    add_warehouse_argument,
    limits_from,
    warehouse_path,
)
from market_pipeline.config import ConfigError, MarketPipelineConfig, load_config
from market_pipeline.warehouse import WarehouseError, open_warehouse
from market_pipeline.warehouse.isolated import run_isolated
from market_pipeline.warehouse.profile import configured_control, configured_lake, configured_warehouse
from market_pipeline.warehouse.sql_guard import SqlLimits, SqlRefused, check_read_only, query_warehouse
from market_pipeline.warehouse.transfer import copy_into_lake, seed_control


def register(sub: argparse._SubParsersAction) -> None:
    sql = sub.add_parser("sql", help="run a read-only SQL query against the warehouse")
    sql.add_argument("query", help="the SQL text")
    add_warehouse_argument(sql)
    sql.add_argument("--json", action="store_true", help="print a JSON list of row objects")
    sql.add_argument("--max-rows", type=number(int, low=1), default=100, help="rows shown in the table view")
    add_limit_arguments(sql)
    sql.set_defaults(handler=run_sql)

    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade the warehouse schema; --to cluster copies the embedded file into the lake",
    )
    add_warehouse_argument(migrate)
    migrate.add_argument(
        "--to",
        choices=["cluster"],
        help="copy the embedded warehouse (--warehouse, else [warehouse] path) into the configured "
        "DuckLake ([warehouse] catalog_url, data_path) and check the rows of every table",
    )
    migrate.set_defaults(handler=run_migrate)

    config = sub.add_parser("config", help="validate and print the effective configuration")
    config.add_argument("--file", help="TOML file (default: shipped defaults or MARKET_PIPELINE_CONFIG)")
    config.set_defaults(handler=run_config)


def _json_default(value: object) -> object:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def run_sql(args: argparse.Namespace) -> int:
    """One read-only query, checked by DuckDB's parser, in a connection cut off from files."""
    try:
        limits = limits_from(args)
        check_read_only(args.query)
        path = warehouse_path(args.warehouse)
        if not path.is_file():
            raise SqlRefused(f"warehouse {path} does not exist or is not a file")
        text = run_isolated(render_query, (str(path), args.query, args.json, args.max_rows), limits)
    except (SqlRefused, WarehouseError, ConfigError) as exc:
        return input_error(exc)
    print(text)
    return 0


def render_query(
    path: str, query: str, as_json: bool, max_rows: int, *, limits: SqlLimits, on_start: Callable[[], None]
) -> str:
    """The query's result as `sql` prints it; runs in the bounded child (warehouse/isolated.py)."""
    frame = query_warehouse(path, query, limits, on_start)
    if as_json:
        return json.dumps(frame.to_dicts(), default=_json_default)
    import polars as pl

    with pl.Config(tbl_rows=max_rows, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
        return str(frame)


def run_migrate(args: argparse.Namespace) -> int:
    try:
        if args.to == "cluster":
            return _copy_to_cluster(args, load_config())
        if args.warehouse:
            warehouse = open_warehouse(warehouse_path(args.warehouse), migrate=False)
        else:
            warehouse = configured_warehouse(load_config())
        applied = warehouse.migrate()
        version = warehouse.schema_version()
        control = {} if warehouse.control is None else {"control_applied": warehouse.control.migrate()}
    except (WarehouseError, ConfigError) as exc:
        return input_error(exc)
    print(
        json.dumps(
            {"warehouse": warehouse.location, "applied": applied, "schema_version": version, **control}
        )
    )
    return 0


def _copy_to_cluster(args: argparse.Namespace, config: MarketPipelineConfig) -> int:
    lake = configured_lake(config)
    if lake is None:
        raise ConfigError(
            "warehouse.backend: --to cluster copies into the configured DuckLake; set "
            'MP__WAREHOUSE__BACKEND=ducklake and MP__WAREHOUSE__CATALOG_URL (see README "Cluster profile")'
        )
    source = warehouse_path(args.warehouse, config)
    copies = copy_into_lake(source, open_warehouse(source, migrate=False, lake=lake))
    control = configured_control(config)
    seeded = {} if control is None else {"control": seed_control(source, control)}
    print(
        json.dumps(
            {
                "from": str(source),
                "to": lake.describe(),
                "tables": {
                    c.table: {"source_rows": c.source_rows, "target_rows": c.target_rows} for c in copies
                },
                "rows": sum(c.target_rows for c in copies),
                **seeded,
            }
        )
    )
    return 0


def run_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        return input_error(exc)
    print(config.model_dump_json(indent=2))
    return 0
