"""`market-pipeline scaling-eval` and `market-pipeline bench scaling`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from market_pipeline.config import ConfigError, load_config
from market_pipeline.tick import Promises
from market_pipeline.scaling.baseline import AutoscalerParams
from market_pipeline.scaling.fleet_sim import FleetParams
from market_pipeline.scaling import tuning
from market_pipeline.scaling.load import LoadFileError, load_helios_demand
from market_pipeline.scaling.replay import (
    DemandLoad,
    ReplaySettings,
    forecast_series,
    replay_baseline,
    replay_policy,
)
from market_pipeline.scaling.settings import normalised_prices, scaling_config_from_config
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
    _add_replay_options(parser)
    parser.set_defaults(handler=run_scaling_eval)
    tuning.register(sub, _add_replay_options)


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser("scaling", help="scaling-eval on every Helios file, with the targets")
    parser.add_argument("--data-dir", default=str(DEFAULT_HELIOS_DIR), help="folder of the Helios vc*.csv files")
    _add_replay_options(parser)
    parser.set_defaults(handler=run_scaling_bench)


def _add_replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config (default: shipped defaults or MARKET_PIPELINE_CONFIG)")
    parser.add_argument("--pool", help="pool id whose guardrail, price bounds and costs apply (default: first)")
    parser.add_argument("--node-gpus", type=int, default=8, help="GPUs per node in the replay")
    parser.add_argument("--max-nodes-factor", type=float, default=2.0, help="fleet size / initial nodes")
    parser.add_argument("--warm-nodes", type=int, help="warm pool size (default: the pool's warm_nodes)")
    parser.add_argument("--cold-delay", type=int, default=8, help="minutes for a cold node to boot")
    parser.add_argument("--warm-delay", type=int, default=1, help="minutes for a warm node to resume")
    parser.add_argument("--drain-minutes", type=int, default=5, help="minutes a non-empty drain takes")
    parser.add_argument("--pin-probability", type=float, default=0.05, help="chance a drained node pins a task")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-utilisation", choices=("pool", "node"), default="pool")
    parser.add_argument("--minutes", type=int, help="replay only the first N minutes")
    parser.add_argument("--tick-minutes", type=int, help="policy tick (default: the config's loop.tick_minutes)")


def build_settings(args: argparse.Namespace, initial_gpus: int) -> ReplaySettings:
    config = load_config(args.config)
    pool_id = args.pool or config.pools[0].pool_id
    scaling = scaling_config_from_config(config, pool_id)
    pool = config.pool_by_id[pool_id]
    warm = pool.warm_nodes if args.warm_nodes is None else args.warm_nodes
    scaling = replace(scaling, backlog=normalised_prices(scaling.backlog, pool.base_price), warm_pool_nodes=warm)
    if args.node_gpus <= 0 or args.max_nodes_factor < 1:
        raise ScalingError("--node-gpus must be > 0 and --max-nodes-factor >= 1")
    initial_nodes = -(-initial_gpus // args.node_gpus)
    fleet = FleetParams(
        node_gpus=args.node_gpus, max_nodes=max(1, int(initial_nodes * args.max_nodes_factor)),
        warm_nodes=warm, cold_delay_minutes=args.cold_delay, warm_delay_minutes=args.warm_delay,
        drain_minutes=args.drain_minutes, pin_probability=args.pin_probability, seed=args.seed,
    )
    tick = config.loop.tick_minutes if args.tick_minutes is None else args.tick_minutes
    if tick <= 0:
        raise ScalingError("--tick-minutes must be > 0")
    return ReplaySettings(
        fleet=fleet, scaling=replace(scaling, interval_minutes=float(tick)),
        baseline=AutoscalerParams(utilisation=args.baseline_utilisation),
        reference_price=1.0, gpu_hour_cost=config.gpu_model_by_name[pool.gpu_model].cost_per_gpu_hour,
        pool=pool_id, tick_minutes=tick, forecast_horizon_minutes=tick, promises=replay_promises(config, pool_id),
    )


def replay_promises(config, pool_id: str) -> Promises:
    """The config's promises for the replay's one price: the max step and the band; the
    guaranteed cap does not bind it. The trace's demand has no class split, and the part its
    price turns away is the delay-sensitive demand of the guardrail's model (the residual
    floor stays), not rigid tenants' guaranteed GPUs, which the cap promises."""
    pool = config.pool_by_id[pool_id]
    market = config.market
    return Promises(max_step=market.max_price_step, guaranteed_cap=max(1.0, pool.price_max / pool.base_price),
                    discount_min=market.drainable_discount_min, discount_max=market.drainable_discount_max)


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
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    _print_table(result)
    for name, met in targets(result).items():
        print(f"{name:28s} {'met' if met else 'MISSED'}")
    return 0


def run_scaling_bench(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    missing = [name for name in HELIOS_FILES if not (data_dir / name).is_file()]
    if missing:
        print(f"error: {data_dir}: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {}
    try:
        for name in HELIOS_FILES:
            load = _load(str(data_dir / name), args.minutes)
            settings = build_settings(args, load.initial_gpus)
            result = evaluate(load, settings)
            report[Path(name).stem] = {**result, "targets": targets(result)}
    except (LoadFileError, ConfigError, ScalingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["all_targets_met"] = all(all(r["targets"].values()) for r in report.values())
    report["settings"] = {
        "fleet": asdict(settings.fleet), "baseline": asdict(settings.baseline),
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
