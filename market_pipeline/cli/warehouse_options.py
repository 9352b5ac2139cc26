"""The warehouse options of the subcommands that read or write it: `--warehouse` and its
default (the configured file), and the limits of a hand-typed query."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from market_pipeline.warehouse.sql_guard import (
    DEFAULT_MAX_RESULT_MB,
    DEFAULT_MAX_ROWS,
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TIMEOUT_SECONDS,
    SqlLimits,
)

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig


def add_warehouse_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--warehouse", help="warehouse file (default: the configured one)")


def warehouse_path(explicit: str | None, config: MarketPipelineConfig | None = None) -> Path:
    """The --warehouse file, else the configured one (the config loaded only when needed)."""
    if explicit:
        return Path(explicit)
    if config is None:
        from market_pipeline.config import load_config  # only when no file was named

        config = load_config()
    return config.warehouse_path


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The time, memory and row limits of a hand-typed query (see warehouse/sql_guard.py)."""
    parser.add_argument(
        "--timeout-seconds",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help="interrupt the query after this long",
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=int,
        default=DEFAULT_MEMORY_LIMIT_MB,
        help="DuckDB memory limit for the query",
    )
    parser.add_argument(
        "--row-limit", type=int, default=DEFAULT_MAX_ROWS, help="refuse results with more rows than this"
    )
    parser.add_argument(
        "--max-result-mb",
        type=int,
        default=DEFAULT_MAX_RESULT_MB,
        help="refuse results larger than this (MB, in Arrow form)",
    )


def limits_from(args: argparse.Namespace) -> SqlLimits:
    return SqlLimits(
        timeout_seconds=args.timeout_seconds,
        memory_limit_mb=args.memory_limit_mb,
        max_rows=args.row_limit,
        max_result_mb=args.max_result_mb,
    )
