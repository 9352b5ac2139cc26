"""`market-pipeline bench simulate-truth`: the truth grid through the job-level simulator.

    market-pipeline bench simulate-truth [--data DIR] [--days 3] [--warmup-days 2] [--seed 0]
        [--points judged|tuning|NAMES] [--opening list|own] [--json OUT]

Prints one JSON object: the summary with the issue's targets, and per truth point the loop
(and the clairvoyant leader) against static, the regret, the experiments' cost and the
elasticity error over time. Skips (one JSON line) where the shared traces are absent.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from market_pipeline.cli.support import input_error
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.settings import OPENINGS

BRIEF_KEYS = (
    "point",
    "regret_share",
    "claims_only_regret_share",
    "experiment_cost_share",
    "experiment_cost_model_share",
    "loop_vs_static",
    "clairvoyant_vs_static",
    "revenue_ge_static",
    "promise_breaches",
    "rigid_sla_violations",
    "elasticity_error_over_time",
    "seconds",
)


def add_opening_option(parser: argparse.ArgumentParser, default: str) -> None:
    """`--opening`: where every strategy's run starts (`SimulationSettings.opening`)."""
    parser.add_argument(
        "--opening",
        choices=OPENINGS,
        default=default,
        help=f"where runs start: 'own' (each strategy's steady state at its own opening prices) or "
        f"'list' (the list-price steady state for every strategy: one state, as a regret needs; "
        f"default {default})",
    )


def register_bench(bench_sub: argparse._SubParsersAction, data_default: str) -> None:
    bench = bench_sub.add_parser(
        "simulate-truth",
        help="the demand-response truth grid through the job-level simulator (openb + Helios), JSON",
    )
    bench.add_argument("--data", default=data_default, help="the shared traces folder")
    bench.add_argument("--days", type=float, default=3.0, help="measured days per truth point (default 3)")
    bench.add_argument(
        "--warmup-days",
        type=float,
        default=2.0,
        help="unmeasured days before them; the loop learns from them too (default 2)",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--points",
        default="",
        help="'judged' (the default), 'tuning' (the points the settings were chosen on), or a comma list of names",
    )
    add_opening_option(bench, "list")
    bench.add_argument("--workers", type=int, help="processes per point (default: CPUs)")
    bench.add_argument("--json", help="also write the full report here")
    bench.set_defaults(handler=run_bench_truth)


def run_bench_truth(args: argparse.Namespace) -> int:
    from market_pipeline.config import load_config
    from market_pipeline.lab.simulate.inputs import load_helios, load_nodes, load_pods, trace_files
    from market_pipeline.lab.simulate.job_grid import run_job_grid, select_points
    from market_pipeline.lab.simulate.settings import SimulationSettings

    files = trace_files(args.data)
    if files is None:
        return 0
    pod_file, node_file, loads = files
    try:
        points = select_points(args.points)
        settings = SimulationSettings(
            days=args.days, seed=args.seed, warmup_days=args.warmup_days, opening=args.opening
        )
        config = load_config()
        pods, nodes = load_pods(pod_file), load_nodes(node_file, config)
        load = load_helios(list(loads), settings.tick_minutes)
        report = run_job_grid(config, settings, points, pods, nodes, load, workers=args.workers)
    except SimulationInputError as exc:
        return input_error(exc)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report))
    brief = [{k: row[k] for k in BRIEF_KEYS} for row in report["points"]]
    print(json.dumps({"summary": report["summary"], "points": brief, "json": args.json}))
    return 0
