"""`market-pipeline bench ticks`: the live loop's solve over many simulated days (`lab.tick_bench`);
`bench scale --decisions-only`: the cluster profile's control state under 1 and N worker
processes (`lab.scale_bench`; the `bench scale` parser is sensors/commands.py's, whose default
mode runs whole ticks through Dagster, and hands this mode's arguments to `run_bench_scale`)."""

from __future__ import annotations

import argparse
import json
import math
from datetime import datetime
from pathlib import Path

from market_pipeline.cli.support import bench_counts, input_error
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


def run_bench_scale(args: argparse.Namespace) -> int:
    from market_pipeline.lab.scale_bench import ScaleBenchSettings, run_scale_bench
    from market_pipeline.warehouse import WarehouseError

    try:
        workers = bench_counts(args.workers, args.rounds, most=16)
    except ValueError as exc:
        return input_error(exc)
    if not (1 <= args.batches <= 10_000 and 1 <= args.per_batch <= 10_000):
        return input_error("--batches and --per-batch must be in 1..10000")
    if not (math.isfinite(args.act_ms) and 0 <= args.act_ms <= 10_000):
        return input_error(f"--act-ms must be in [0, 10000], got {args.act_ms}")
    url = args.control_url
    if url is None:
        try:
            url = load_config().control_url
        except ConfigError as exc:
            return input_error(exc)
    if not url:
        return input_error("bench scale needs a control PostgreSQL: set [control] url or pass --control-url")
    if not args.schema_prefix.replace("_", "").isalnum() or args.schema_prefix[0].isdigit():
        return input_error(f"--schema-prefix must be letters, digits and _, got {args.schema_prefix!r}")
    settings = ScaleBenchSettings(
        url, workers, args.batches, args.per_batch, args.act_ms, args.schema_prefix, rounds=args.rounds
    )
    try:
        result = run_scale_bench(settings)
    except WarehouseError as exc:
        return input_error(exc)
    print(json.dumps(result))
    return 0
