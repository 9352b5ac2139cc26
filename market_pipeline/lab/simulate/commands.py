"""CLI of the offline market simulator: `market-pipeline simulate ...` and `bench simulate`.

    market-pipeline simulate --pods openb_pod_list_default.csv --nodes openb_node_list_gpu_node.csv \
        --load helios-earth/vc6YE.csv,helios-earth/vcLJZ.csv --days 7 \
        --strategies static,utilization,stackelberg --placement round_robin,best_fit,fragment_aware \
        --seed 0 --json out.json --html out.html

Writes the full report to --json (and an HTML page with plots to --html), prints one JSON
object (the strategy and placement metrics, the target checks, the output paths) on stdout;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from market_pipeline.cli.support import input_error
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.job_grid_commands import add_opening_option

REPO_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
LATEST_REPORT = "var/simulation/latest.json"


def _csv_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--days", type=float, default=7.0, help="simulated days (default 7)")
    parser.add_argument("--tick-minutes", type=int, default=60, help="pricing tick (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--strategies",
        type=_csv_list,
        default=("static", "utilization", "stackelberg"),
        help="comma list of static, utilization, stackelberg (learning), clairvoyant (knows the truth), claims (the claims alone)",
    )
    parser.add_argument(
        "--placement",
        type=_csv_list,
        default=("round_robin", "best_fit", "fragment_aware"),
        help="policies compared at saturation (FGD experiment); 'none' skips it",
    )
    parser.add_argument("--policy", default="best_fit", help="placement policy of the strategy runs")
    parser.add_argument(
        "--load-start-day",
        type=float,
        default=14.0,
        help="first day of the load trace simulated; the days before are forecast history",
    )
    parser.add_argument(
        "--target-utilization",
        type=float,
        help="mean demand / capacity at the list price (default: the simulated adapter's "
        "workload target); the load trace gives the shape over time",
    )
    parser.add_argument(
        "--elastic-elasticity", type=float, help="elastic tenants' price elasticity (default 2)"
    )
    parser.add_argument(
        "--rigid-elasticity", type=float, help="rigid tenants' price elasticity (default 0.2)"
    )
    parser.add_argument(
        "--guaranteed-cap",
        type=float,
        help="max guaranteed price / list price, the promise to rigid tenants (default 1.04)",
    )
    parser.add_argument("--tenants-per-class", type=int, help="tenants per class (default 16)")
    parser.add_argument(
        "--budget-headroom", type=float, help="tenant budget / spend at the list price - 1 (default 0.25)"
    )
    parser.add_argument(
        "--unit-cost-share",
        type=float,
        help="unit cost / list price for models the config does not price (default 0.5)",
    )
    parser.add_argument(
        "--elastic-patience-hours",
        type=float,
        help="hours priced-out elastic work waits for a price it accepts (default 24; 0: lost)",
    )
    parser.add_argument(
        "--avoidable-cost-share",
        type=float,
        help="share of the unit cost a sold GPU-hour adds, what the leader prices against "
        "(default 0.05; the rest is charged on the powered fleet)",
    )
    parser.add_argument(
        "--latent-elastic-ratio",
        type=float,
        help="latent elastic demand at half the list price / the trace's elastic demand at list "
        "(default 1; 0: the trace alone)",
    )
    parser.add_argument(
        "--warmup-days",
        type=float,
        help="unmeasured days of the trace run before the window, every strategy alike (default 3)",
    )
    add_opening_option(parser, "own")
    parser.add_argument("--workers", type=int, help="processes for the strategies (default: CPUs)")
    parser.add_argument("--config", help="TOML config (default: shipped or MARKET_PIPELINE_CONFIG)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate", help="offline market simulation: pricing strategies and placement policies"
    )
    sim.add_argument("--pods", required=True, help="openb pod list CSV")
    sim.add_argument("--nodes", required=True, help="node list CSV (openb or spot node_info_df)")
    sim.add_argument(
        "--load", type=_csv_list, default=(), help="Helios per-minute CSV(s), comma separated (summed)"
    )
    _add_model_options(sim)
    sim.add_argument("--json", required=True, help="write the report JSON here")
    sim.add_argument("--html", help="write the HTML report with plots here")
    sim.add_argument(
        "--publish",
        action="store_true",
        help=f"also copy the report to {LATEST_REPORT} (what the Dagster asset shows)",
    )
    sim.set_defaults(handler=run_simulate)


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser("simulate", help="7 simulated days on the openb fleet with Helios load")
    bench.add_argument("--data", default=str(REPO_DATA), help="the shared traces folder")
    _add_model_options(bench)
    bench.add_argument("--json", help="also write the full report here")
    bench.set_defaults(handler=run_bench)
    from market_pipeline.lab.simulate.job_grid_commands import register_bench as register_truth

    register_truth(bench_sub, str(REPO_DATA))
    from market_pipeline.lab.simulate.guarantee_commands import register_bench as register_guarantee

    register_guarantee(bench_sub, str(REPO_DATA))


def _settings(args: argparse.Namespace) -> Any:
    from market_pipeline.lab.simulate.settings import EconomicAssumptions, SimulationSettings

    changes = {
        key: getattr(args, attr)
        for key, attr in (
            ("elastic_elasticity", "elastic_elasticity"),
            ("rigid_elasticity", "rigid_elasticity"),
            ("guaranteed_cap", "guaranteed_cap"),
            ("tenants_per_class", "tenants_per_class"),
            ("budget_headroom", "budget_headroom"),
            ("unit_cost_share", "unit_cost_share"),
            ("elastic_patience_hours", "elastic_patience_hours"),
            ("avoidable_cost_share", "avoidable_cost_share"),
            ("latent_elastic_ratio", "latent_elastic_ratio"),
        )
        if getattr(args, attr) is not None
    }
    timing = {} if args.warmup_days is None else {"warmup_days": args.warmup_days}
    return SimulationSettings(
        days=args.days,
        tick_minutes=args.tick_minutes,
        seed=args.seed,
        strategies=tuple(args.strategies),
        placement_policy=args.policy,
        load_start_day=args.load_start_day,
        target_utilization=args.target_utilization,
        economics=EconomicAssumptions(**changes),
        opening=args.opening,
        **timing,
    )


def _check_args(args: argparse.Namespace, outputs: tuple[str | None, ...]) -> None:
    """Refuse bad arguments and unwritable outputs before the run, not after it."""
    from market_pipeline.lab.simulate.settings import PLACEMENT_NAMES

    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SimulationInputError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    unknown = [p for p in args.placement if p not in (*PLACEMENT_NAMES, "none")]
    if unknown:
        raise SimulationInputError(f"--placement {unknown}: choose from {[*PLACEMENT_NAMES, 'none']}")
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise SimulationInputError(f"--workers must be in [1, 256], got {args.workers}")
    for path in filter(None, outputs):
        _check_writable(Path(path))


def _check_writable(path: Path) -> None:
    """Probe with a temporary file next to `path` (os.access says yes to root on /proc)."""
    if path.is_dir():
        raise SimulationInputError(f"output {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".probe-"):
            pass
        if path.exists() and not os.access(path, os.W_OK):
            raise OSError("not writable")
    except OSError as exc:
        raise SimulationInputError(f"output {path} cannot be written: {exc.strerror or exc}") from None


def _progress(enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    bar = tqdm(total=1, unit="tick", file=sys.stderr, desc="simulating", dynamic_ncols=True)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()

    return update


def _summary(report: dict[str, Any], paths: dict[str, str | None]) -> dict[str, Any]:
    strategies = {
        name: {k: v for k, v in m.items() if k != "extra"} for name, m in report["strategies"].items()
    }
    return {
        "strategies": strategies,
        "placement": report["placement"],
        "targets": report["targets"],
        "timing": report["timing"],
        **paths,
    }


def _write(report: dict[str, Any], json_path: str | None, html_path: str | None, publish: bool) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report))
    if html_path:
        from market_pipeline.lab.simulate.report_html import render_html

        Path(html_path).parent.mkdir(parents=True, exist_ok=True)
        Path(html_path).write_text(render_html(report))
    if publish:
        from market_pipeline.config import load_config

        latest = load_config().resolve_path(LATEST_REPORT)
        latest.parent.mkdir(parents=True, exist_ok=True)
        latest.write_text(json.dumps(report))


def run_simulate(args: argparse.Namespace) -> int:
    from market_pipeline.config import ConfigError, load_config
    from market_pipeline.lab.simulate.simulation import simulate_files

    try:
        _check_args(args, (args.json, args.html))
        config = load_config(args.config)
        report = simulate_files(
            config,
            _settings(args),
            pods=args.pods,
            nodes=args.nodes,
            loads=args.load,
            placement=tuple(p for p in args.placement if p != "none"),
            workers=args.workers,
            progress=_progress(not args.no_progress),
        )
    except (SimulationInputError, ConfigError) as exc:
        return input_error(exc)
    _write(report, args.json, args.html, args.publish)
    print(json.dumps(_summary(report, {"json": args.json, "html": args.html})))
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.config import load_config
    from market_pipeline.lab.simulate.inputs import trace_files
    from market_pipeline.lab.simulate.simulation import simulate_files

    files = trace_files(args.data)
    if files is None:
        return 0
    pods, nodes, loads = files
    try:
        _check_args(args, (args.json,))
        report = simulate_files(
            load_config(args.config),
            _settings(args),
            pods=pods,
            nodes=nodes,
            loads=loads,
            placement=tuple(p for p in args.placement if p != "none"),
            workers=args.workers,
            progress=_progress(not args.no_progress),
        )
    except SimulationInputError as exc:
        return input_error(exc)
    _write(report, args.json, None, False)
    print(json.dumps(_summary(report, {"json": args.json, "loads": loads})))
    return 0
