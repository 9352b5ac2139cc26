"""`market-pipeline bench ticks`: the live loop's solve over many simulated days (`lab.tick_bench`)."""

from __future__ import annotations

import argparse
import json
import math
from datetime import datetime
from pathlib import Path

from market_pipeline.cli.support import input_error
from market_pipeline.config import ConfigError, load_config


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: the lab only adds benchmarks."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser(
        "ticks", help="the loop's market solve on the default fleet over simulated days from several epochs"
    )
    parser.add_argument("--days", type=float, default=30.0, help="simulated days per epoch (default 30)")
    parser.add_argument("--epochs", type=int, default=3, help="how many epochs, 3 days apart (default 3)")
    parser.add_argument(
        "--epoch", action="append", default=[], help="an explicit epoch (ISO, with offset); repeatable"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn demand-response fits")
    parser.add_argument(
        "--dump-fallbacks", default=None, help="write each fallback tick's inputs here (JSON)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    parser.set_defaults(handler=run_bench_ticks)


def run_bench_ticks(args: argparse.Namespace) -> int:
    from market_pipeline.lab.tick_bench import TickBenchSettings, default_epochs, run_tick_bench

    if not (math.isfinite(args.days) and 0 < args.days <= 365):
        return input_error(f"--days must be in (0, 365], got {args.days}")
    if not 1 <= args.epochs <= 50:
        return input_error(f"--epochs must be in 1..50, got {args.epochs}")
    try:
        explicit = tuple(datetime.fromisoformat(e) for e in args.epoch)
    except ValueError as exc:
        return input_error(f"--epoch: {exc}")
    if any(e.tzinfo is None for e in explicit):
        return input_error("--epoch must carry a UTC offset, e.g. 2026-11-01T00:00:00+00:00")
    try:
        config = load_config()
    except ConfigError as exc:
        return input_error(exc)
    epochs = explicit or default_epochs(args.epochs, args.days)
    dump = Path(args.dump_fallbacks) if args.dump_fallbacks else None
    result = run_tick_bench(
        config, TickBenchSettings(days=args.days, epochs=epochs, seed=args.seed, dump_dir=dump)
    )
    print(json.dumps(result))
    return 0
