"""The replay's command-line options and the settings they make: shared by `scaling-eval`,
`bench scaling` (commands.py) and the tuning sweep (tuning.py), which must replay alike."""

from __future__ import annotations

import argparse
from dataclasses import replace

from market_pipeline.cli.support import number
from market_pipeline.config import load_config
from market_pipeline.lab.scaling.baseline import AutoscalerParams
from market_pipeline.lab.scaling.fleet_sim import FleetParams
from market_pipeline.lab.scaling.replay import ReplaySettings
from market_pipeline.scaling.settings import normalised_prices, scaling_config_from_config
from market_pipeline.scaling.types import ScalingError
from market_pipeline.tick import Promises

# Bounds of the replay's size: a load file claiming 1e12 GPUs is refused, not simulated.
MAX_NODE_GPUS = 64
MAX_NODES_FACTOR = 100.0
MAX_REPLAY_NODES = 200_000


def add_replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config (default: shipped defaults or MARKET_PIPELINE_CONFIG)")
    parser.add_argument(
        "--pool", help="pool id whose guardrail, price bounds and costs apply (default: first)"
    )
    parser.add_argument(
        "--node-gpus",
        type=number(int, low=1, high=MAX_NODE_GPUS),
        default=8,
        help="GPUs per node in the replay",
    )
    parser.add_argument(
        "--max-nodes-factor",
        type=number(float, low=1, high=MAX_NODES_FACTOR),
        default=2.0,
        help="fleet size / initial nodes",
    )
    parser.add_argument("--warm-nodes", type=int, help="warm pool size (default: the pool's warm_nodes)")
    parser.add_argument("--cold-delay", type=int, default=8, help="minutes for a cold node to boot")
    parser.add_argument("--warm-delay", type=int, default=1, help="minutes for a warm node to resume")
    parser.add_argument("--drain-minutes", type=int, default=5, help="minutes a non-empty drain takes")
    parser.add_argument(
        "--pin-probability",
        type=number(float, low=0, high=1),
        default=0.05,
        help="chance a drained node pins a task",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-utilisation", choices=("pool", "node"), default="pool")
    parser.add_argument("--minutes", type=number(int, low=1), help="replay only the first N minutes")
    parser.add_argument(
        "--tick-minutes",
        type=number(int, low=1, high=24 * 60),
        help="policy tick (default: the config's loop.tick_minutes)",
    )


def build_settings(args: argparse.Namespace, initial_gpus: int) -> ReplaySettings:
    config = load_config(args.config)
    pool_id = args.pool or config.pools[0].pool_id
    if pool_id not in config.pool_by_id:
        raise ScalingError(f"--pool {pool_id!r} is not a configured pool (have {sorted(config.pool_by_id)})")
    scaling = scaling_config_from_config(config, pool_id)
    pool = config.pool_by_id[pool_id]
    warm = pool.warm_nodes if args.warm_nodes is None else args.warm_nodes
    scaling = replace(
        scaling, backlog=normalised_prices(scaling.backlog, pool.base_price), warm_pool_nodes=warm
    )
    if args.node_gpus <= 0 or args.max_nodes_factor < 1:
        raise ScalingError("--node-gpus must be > 0 and --max-nodes-factor >= 1")
    initial_nodes = -(-initial_gpus // args.node_gpus)
    if initial_nodes * args.max_nodes_factor > MAX_REPLAY_NODES:
        raise ScalingError(
            f"the replay fleet would hold {initial_nodes * args.max_nodes_factor:.3g} nodes"
            f" ({initial_gpus} GPUs in the load / {args.node_gpus} per node x {args.max_nodes_factor:g});"
            f" at most {MAX_REPLAY_NODES} are replayed"
        )
    fleet = FleetParams(
        node_gpus=args.node_gpus,
        max_nodes=max(1, int(initial_nodes * args.max_nodes_factor)),
        warm_nodes=warm,
        cold_delay_minutes=args.cold_delay,
        warm_delay_minutes=args.warm_delay,
        drain_minutes=args.drain_minutes,
        pin_probability=args.pin_probability,
        seed=args.seed,
    )
    tick = config.loop.tick_minutes if args.tick_minutes is None else args.tick_minutes
    if tick <= 0:
        raise ScalingError("--tick-minutes must be > 0")
    return ReplaySettings(
        fleet=fleet,
        scaling=replace(scaling, interval_minutes=float(tick)),
        baseline=AutoscalerParams(utilisation=args.baseline_utilisation),
        reference_price=1.0,
        gpu_hour_cost=config.gpu_model_by_name[pool.gpu_model].cost_per_gpu_hour,
        pool=pool_id,
        tick_minutes=tick,
        forecast_horizon_minutes=tick,
        promises=replay_promises(config, pool_id),
    )


def replay_promises(config, pool_id: str) -> Promises:
    """The config's promises for the replay's one price: the max step and the band; the
    guaranteed cap does not bind it. The trace's demand has no class split, and the part its
    price turns away is the delay-sensitive demand of the guardrail's model (the residual
    floor stays), not rigid tenants' guaranteed GPUs, which the cap promises."""
    pool = config.pool_by_id[pool_id]
    return Promises.from_config(config, guaranteed_cap=max(1.0, pool.price_max / pool.base_price))
