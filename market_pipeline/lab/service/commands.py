"""`market-pipeline bench serve` (price and quote latency at a fixed rate against a bare endpoint) and
`bench webhooks` (real drains warning their tenants through failing webhook receivers)."""

from __future__ import annotations

import argparse
import json
import sys

from market_pipeline.cli.support import input_error
from market_pipeline.cli.warehouse_options import add_warehouse_argument
from market_pipeline.config import ConfigError, load_config


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser(
        "serve", help="GET price and quote latency at a fixed rate vs a bare endpoint"
    )
    add_warehouse_argument(bench)
    bench.add_argument("--rate", type=float, default=200.0, help="requests per second offered")
    bench.add_argument("--seconds", type=float, default=10.0, help="seconds per measured endpoint")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(handler=run_bench)

    hooks = bench_sub.add_parser(
        "webhooks",
        help="N real drains warn their tenants through webhooks to receivers failing half their calls",
    )
    hooks.add_argument("--drains", type=int, default=1000, help="drains to run (default 1000)")
    hooks.add_argument("--writers", type=int, default=1, help="drains running at once, one node each")
    hooks.add_argument(
        "--connection",
        choices=("per-drain", "per-step"),
        default="per-drain",
        help="a drain holds one warehouse connection (the CLI's way) or opens one per step (the loop's)",
    )
    hooks.add_argument("--gap", type=float, default=0.1, help="seconds between one node's drains")
    hooks.add_argument(
        "--fail-every", type=int, default=2, help="every receiver fails every Nth call (0: none)"
    )
    hooks.add_argument("--json", action="store_true")
    hooks.set_defaults(handler=run_webhook_bench)


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.lab.service.bench import run_serve_bench
    from market_pipeline.warehouse import WarehouseError

    try:
        result = run_serve_bench(load_config(), args.warehouse, args.rate, args.seconds)
    except (ConfigError, WarehouseError, ValueError) as exc:
        return input_error(exc)
    print(json.dumps(result, indent=None if args.json else 2), file=sys.stdout)
    return 0 if result["meets_targets"] else 1


def run_webhook_bench(args: argparse.Namespace) -> int:
    from market_pipeline.lab.service.webhook_bench import run_webhook_bench as bench

    try:
        result = bench(load_config(), args.drains, args.writers, args.fail_every, args.connection, args.gap)
    except (ConfigError, ValueError, RuntimeError) as exc:
        return input_error(exc)
    print(json.dumps(result, indent=None if args.json else 2), file=sys.stdout)
    return 0 if result["meets_targets"] else 1
