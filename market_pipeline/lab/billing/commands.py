"""`market-pipeline bench billing`: the dbt rollup against one hand-written DuckDB query (`bench`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from market_pipeline.billing.commands import _fail
from market_pipeline.billing.errors import BillingError
from market_pipeline.config import ConfigError, load_config
from market_pipeline.warehouse import WarehouseError


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser("billing", help="dbt rollup vs one hand-written DuckDB query")
    bench.add_argument("--usage-seconds", type=int, default=100_000_000)
    bench.add_argument(
        "--interval-seconds",
        type=int,
        default=None,
        help="mean usage interval length (default: see bench.DEFAULT_INTERVAL_SECONDS)",
    )
    bench.add_argument("--workdir", help="where the scratch warehouse goes (default: system temp)")
    bench.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of one hand query then one dbt rollup (the fastest of each is reported)",
    )
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.lab.billing.bench import DEFAULT_INTERVAL_SECONDS, run_billing_bench

    try:
        result = run_billing_bench(
            load_config(),
            args.usage_seconds,
            args.interval_seconds or DEFAULT_INTERVAL_SECONDS,
            Path(args.workdir) if args.workdir else None,
            rounds=args.rounds,
        )
    except (BillingError, ConfigError, WarehouseError, ValueError) as exc:
        return _fail(exc)
    print(json.dumps(result.as_json()))
    return 0 if result.equal else 1
