"""The `market-pipeline` command.

Each concern registers its own subcommands (and `bench` targets) from a `commands`
module, so this file only composes them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules exposing `register(sub)` and optionally `register_bench(bench_sub)`.
COMMAND_MODULES: tuple[str, ...] = (
    "market_pipeline.commands",
    "market_pipeline.guardrails.commands",
    "market_pipeline.forecast.commands",
    "market_pipeline.market.commands",
    "market_pipeline.telemetry.commands",
    "market_pipeline.scaling.commands",
    "market_pipeline.fleet.commands",
    "market_pipeline.placement.commands",
    "market_pipeline.simulate.commands",
    "market_pipeline.billing.commands",
    "market_pipeline.billing.export",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="market-pipeline",
        description="Control plane of a multi-tenant GPU cloud.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks against a baseline, JSON output")
    bench_sub = bench.add_subparsers(dest="bench_target", required=True)
    for module_name in COMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.register(sub)
        register_bench = getattr(module, "register_bench", None)
        if register_bench is not None:
            register_bench(bench_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"no handler for command {args.command!r}")
    try:
        return int(handler(args) or 0)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
