"""`market-pipeline bench forecast`: fit and forecast time for many synthetic pools (`synthetic`)."""

from __future__ import annotations

import argparse
import json

from market_pipeline.cli.support import input_error
from market_pipeline.forecast.commands import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser("forecast", help="fit + forecast time for many synthetic pools")
    bench.add_argument("--pools", type=int, default=500, help="number of pools (default 500)")
    bench.add_argument("--days", type=float, default=3.0, help="history per pool in days")
    bench.add_argument("--seed", type=int, default=0, help="seed of the synthetic demand")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.lab.forecast.bench import run_forecast_bench

    if args.pools < 1 or args.days <= 0:
        return input_error("--pools must be >= 1 and --days > 0")
    report = run_forecast_bench(args.pools, days=args.days, seed=args.seed)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>24}: {value}")
    return EXIT_OK
