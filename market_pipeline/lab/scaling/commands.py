"""`market-pipeline scaling-eval` and `market-pipeline bench scaling`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from market_pipeline.cli.support import input_error
from market_pipeline.config import ConfigError
from market_pipeline.lab.scaling import tuning
from market_pipeline.lab.scaling.load import LoadFileError, load_helios_demand
from market_pipeline.lab.scaling.replay import (
    DemandLoad,
    ReplaySettings,
    forecast_series,
    replay_baseline,
    replay_policy,
)
from market_pipeline.lab.scaling.replay_options import add_replay_options, build_settings
from market_pipeline.scaling.types import ScalingError

HELIOS_FILES = ("vc6YE.csv", "vcLJZ.csv", "vchbv.csv", "vcvlY.csv")
DEFAULT_HELIOS_DIR = Path("../shared/data/helios-earth")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "scaling-eval",
        help="replay a Helios demand file through the scaling policy and a cluster-autoscaler baseline",
    )
    parser.add_argument("--load", required=True, help="Helios per-minute CSV (running+pending GPUs)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_replay_options(parser)
    parser.set_defaults(handler=run_scaling_eval)
    tuning.register(sub)


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser("scaling", help="scaling-eval on every Helios file, with the targets")
    parser.add_argument(
        "--data-dir", default=str(DEFAULT_HELIOS_DIR), help="folder of the Helios vc*.csv files"
    )
    parser.add_argument(
        "--files",
        default=",".join(Path(n).stem for n in HELIOS_FILES),
        help="comma-separated vc names in --data-dir (default: the four shared files, the tuning set)",
    )
    add_replay_options(parser)
    parser.set_defaults(handler=run_scaling_bench)


def evaluate(load: DemandLoad, settings: ReplaySettings) -> dict[str, dict[str, Any]]:
    forecasts = forecast_series(load, settings)
    print(f"replaying {load.source} ({load.demand.size} minutes) through the policy", file=sys.stderr)
    policy = replay_policy(load, settings, forecasts)
    print("... and through the cluster-autoscaler baseline", file=sys.stderr)
    baseline = replay_baseline(load, settings, forecasts)
    return {"policy": policy, "baseline": baseline}


def targets(result: dict[str, dict[str, Any]]) -> dict[str, bool]:
    policy, baseline = result["policy"], result["baseline"]
    return {
        "idle_le_0.7x_baseline": policy["idle_gpu_hours"] <= 0.7 * baseline["idle_gpu_hours"],
        "pending_le_baseline": policy["pending_gpu_minutes"] <= baseline["pending_gpu_minutes"],
        "no_certificate_violations": policy["certificate_violations"] == 0,
        "actions_le_baseline": policy["actions_per_day"] <= baseline["actions_per_day"],
    }


def _load(path: str, minutes: int | None) -> DemandLoad:
    load = load_helios_demand(path)
    if minutes is not None:
        if minutes <= 0:
            raise ScalingError("--minutes must be > 0")
        load = load.window(0, min(minutes, load.demand.size))
    return load


def run_scaling_eval(args: argparse.Namespace) -> int:
    try:
        load = _load(args.load, args.minutes)
        result = evaluate(load, build_settings(args, load.initial_gpus))
    except (LoadFileError, ConfigError, ScalingError) as exc:
        return input_error(exc)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_table(result)
    for name, met in targets(result).items():
        print(f"{name:28s} {'met' if met else 'MISSED'}")
    return 0


def run_scaling_bench(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    files = [f"{n.strip()}.csv" for n in args.files.split(",") if n.strip()]
    if not files:
        return input_error("--files: no file named")
    missing = [name for name in files if not (data_dir / name).is_file()]
    if missing:
        return input_error(f"{data_dir}: missing {', '.join(missing)}")
    report: dict[str, Any] = {}
    try:
        for name in files:
            load = _load(str(data_dir / name), args.minutes)
            settings = build_settings(args, load.initial_gpus)
            result = evaluate(load, settings)
            report[Path(name).stem] = {**result, "targets": targets(result)}
    except (LoadFileError, ConfigError, ScalingError) as exc:
        return input_error(exc)
    report["all_targets_met"] = all(all(r["targets"].values()) for r in report.values())
    report["settings"] = {
        "fleet": asdict(settings.fleet),
        "baseline": asdict(settings.baseline),
        "tick_minutes": settings.tick_minutes,
        "scaling": {k: v for k, v in asdict(settings.scaling).items() if k != "backlog"},
        "backlog": asdict(settings.scaling.backlog),
    }
    print(json.dumps(report))
    return 0


def _print_table(result: dict[str, dict[str, Any]]) -> None:
    print(f"{'metric':30s} {'policy':>14s} {'baseline':>14s}")
    for key in result["policy"]:
        print(f"{key:30s} {result['policy'][key]!s:>14s} {result['baseline'][key]!s:>14s}")
