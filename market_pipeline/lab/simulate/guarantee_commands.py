"""`market-pipeline bench guarantee`: the rigid guarantee on a grid of weeks (JSON).

    market-pipeline bench guarantee [--data DIR] [--pods A.csv,B.csv] [--loads X.csv,Y.csv]
        [--seeds 7] [--role judged|tuning] [--days 2] [--warmup-days 3] [--load-start-day 14]
        [--before] [--ceiling] [--premium-only] [--json OUT]

Without `--pods`/`--loads` it runs the shared traces' weeks (the default openb sample with
each shared Helios cluster), the weeks the hold's size was chosen on (`tuning`). Other openb
samples and Earth clusters (alibaba/clusterdata, HeliosArtifact) given with `--pods`/`--loads`
are `judged` (`--role`). Skips (one JSON line) where the shared traces are absent.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from market_pipeline.cli.support import input_error
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.settings import SimulationSettings


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def register_bench(bench_sub: argparse._SubParsersAction, data_default: str) -> None:
    bench = bench_sub.add_parser(
        "guarantee", help="the rigid tenants' guarantee vs static pricing on a grid of weeks, JSON"
    )
    bench.add_argument("--data", default=data_default, help="the shared traces folder")
    bench.add_argument("--pods", type=_csv, default=(), help="openb pod lists, comma separated")
    bench.add_argument("--loads", type=_csv, default=(), help="Helios cluster files, comma separated")
    bench.add_argument("--seeds", type=_csv, default=("7",), help="seeds, comma separated (default 7)")
    bench.add_argument(
        "--role",
        choices=("tuning", "judged"),
        help="the weeks' role (default: tuning for "
        "the shared traces' weeks, judged for weeks given with --pods or --loads)",
    )
    bench.add_argument("--days", type=float, default=2.0, help="measured days per week (default 2)")
    bench.add_argument("--warmup-days", type=float, default=3.0, help="unmeasured days before (default 3)")
    bench.add_argument(
        "--load-start-day",
        type=float,
        default=SimulationSettings.load_start_day,
        help="first measured day of each load trace (default 14); the warm-up days come before "
        "it, the days before those are forecast history. A trace with a gap inside that window "
        "is refused: choose another day",
    )
    bench.add_argument("--before", action="store_true", help="also run with the guarantee off (the old rule)")
    bench.add_argument(
        "--ceiling",
        action="store_true",
        help="also run the clairvoyant leader (knows the tenants' true response): what the market "
        "can earn on each week; a week whose only miss is revenue below that ceiling is beyond_ceiling",
    )
    bench.add_argument(
        "--premium-only",
        action="store_true",
        help="also run static pricing plus the guaranteed premium and nothing else: what the premium "
        "alone does to rigid work on each week (reported, not judged)",
    )
    bench.add_argument("--workers", type=int, help="processes per week (default: CPUs)")
    bench.add_argument("--config", help="TOML config (default: shipped or MARKET_PIPELINE_CONFIG)")
    bench.add_argument("--json", help="also write the full report here")
    bench.set_defaults(handler=run_bench_guarantee)


def run_bench_guarantee(args: argparse.Namespace) -> int:
    from market_pipeline.config import load_config
    from market_pipeline.lab.simulate.guarantee_bench import Week, run_grid, table
    from market_pipeline.lab.simulate.inputs import trace_files

    files = trace_files(args.data)
    if files is None:
        return 0
    shared_pods, nodes, shared_loads = files
    role = args.role or ("judged" if args.pods or args.loads else "tuning")
    pods = args.pods or (shared_pods,)
    loads = args.loads or shared_loads
    try:
        seeds = [int(s) for s in args.seeds]
    except ValueError:
        return input_error(SimulationInputError(f"--seeds {','.join(args.seeds)}: not integers"))
    for path in (*pods, *loads):
        if not Path(path).is_file():
            return input_error(SimulationInputError(f"{path}: no such file"))
    weeks = [Week(p, ld, s, role) for p in pods for ld in loads for s in seeds]
    try:
        report = run_grid(
            load_config(args.config),
            weeks,
            nodes,
            args.days,
            args.warmup_days,
            args.before,
            args.workers,
            args.ceiling,
            args.load_start_day,
            args.premium_only,
        )
    except SimulationInputError as exc:
        return input_error(exc)
    report["table"] = table(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, default=float))
    print(json.dumps({"summary": report["summary"], "table": report["table"], "json": args.json}))
    return 0
