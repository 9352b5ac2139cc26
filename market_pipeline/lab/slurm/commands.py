"""`market-pipeline bench slurm`: the slurm backend on a local test cluster."""

from __future__ import annotations

import argparse
import json
import sys

from market_pipeline.cli.support import input_error
from market_pipeline.config import ConfigError, load_config
from market_pipeline.hardware.slurm.commands import RUNTIME_ERROR, _plain


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser("slurm", help="the slurm backend on a local cluster (4 x 8 GPUs, 200 jobs)")
    bench.add_argument("--nodes", type=int, default=4)
    bench.add_argument("--gpus-per-node", type=int, default=8)
    bench.add_argument("--jobs", type=int, default=200)
    bench.add_argument("--max-job-seconds", type=int, default=20)
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.hardware.slurm.client import SlurmError
    from market_pipeline.hardware.slurm.cluster import ClusterError
    from market_pipeline.lab.slurm.bench import run_slurm_bench

    if not (2 <= args.nodes <= 64 and 1 <= args.gpus_per_node <= 16 and 1 <= args.jobs <= 5000):
        return input_error("need 2 <= --nodes <= 64, 1 <= --gpus-per-node <= 16, 1 <= --jobs <= 5000")
    if not 3 <= args.max_job_seconds <= 600:
        return input_error("need 3 <= --max-job-seconds <= 600")
    try:
        config = load_config()
        report = run_slurm_bench(
            config,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            jobs=args.jobs,
            max_job_seconds=args.max_job_seconds,
        )
    except ConfigError as exc:
        return input_error(exc)
    except (ClusterError, SlurmError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return RUNTIME_ERROR
    print(json.dumps(report, indent=2, default=str) if args.json else _plain(report))
    return 0
