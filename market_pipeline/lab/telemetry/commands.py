"""`market-pipeline bench ingest` (validated ingest against a bare DuckDB append) and `bench telemetry-checks`
(the partition checks on a fleet hour), on synthetic samples (`synthetic`)."""

from __future__ import annotations

import argparse

from market_pipeline.config import ConfigError, load_config
from market_pipeline.telemetry.commands import _emit, _fail, _log


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    ingest = bench_sub.add_parser("ingest", help="validated telemetry ingest vs bare DuckDB append")
    ingest.add_argument("--rows", type=int, default=1_000_000)
    ingest.add_argument(
        "--bad-share", type=float, default=0.001, help="share of spoiled rows in the generated input"
    )
    ingest.add_argument("--dir", help="scratch directory (default: the system temp dir)")
    ingest.add_argument(
        "--repeats", type=int, default=2, help="alternating runs of each contender; the best of each counts"
    )
    ingest.add_argument("--json", action="store_true")
    ingest.set_defaults(handler=run_bench_ingest)

    checks = bench_sub.add_parser("telemetry-checks", help="partition checks on a fleet hour")
    checks.add_argument("--nodes", type=int, default=1000)
    checks.add_argument("--gpus-per-node", type=int, default=8)
    checks.add_argument("--dir", help="scratch directory (default: the system temp dir)")
    checks.add_argument("--json", action="store_true")
    checks.set_defaults(handler=run_bench_checks)


def run_bench_ingest(args: argparse.Namespace) -> int:
    from market_pipeline.lab.telemetry.bench import bench_ingest

    if args.rows < 1:
        return _fail("--rows must be at least 1", args.json)
    _emit(
        bench_ingest(args.rows, bad_share=args.bad_share, workdir=args.dir, repeats=args.repeats, log=_log),
        args.json,
    )
    return 0


def run_bench_checks(args: argparse.Namespace) -> int:
    from market_pipeline.lab.telemetry.bench import bench_checks

    try:
        telemetry = load_config().telemetry
    except ConfigError as exc:
        return _fail(str(exc), args.json, code=1)
    _emit(
        bench_checks(args.nodes, args.gpus_per_node, workdir=args.dir, telemetry=telemetry, log=_log),
        args.json,
    )
    return 0
