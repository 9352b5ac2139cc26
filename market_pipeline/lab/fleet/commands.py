"""`market-pipeline bench fleet-telemetry`: the twin's speed on a large fleet (events, then samples)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import UTC, datetime

import numpy as np

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.fleet.setup import build_setup, default_epoch


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser(
        "fleet-telemetry", help="twin speed on a large fleet (default 1,000 x 8 GPUs, 1 h)"
    )
    bench.add_argument("--nodes", type=int, default=1000)
    bench.add_argument("--gpus-per-node", type=int, default=8)
    bench.add_argument("--hours", type=float, default=1.0)
    bench.set_defaults(handler=run_bench)


def scaled_config(config: MarketPipelineConfig, nodes: int, gpus_per_node: int) -> MarketPipelineConfig:
    """The config with one pool of `nodes` ON nodes (the first pool's model) and no others."""
    first = config.pools[0].model_copy(
        update={"nodes": nodes, "max_nodes": nodes, "warm_nodes": 0, "gpus_per_node": gpus_per_node}
    )
    return config.model_copy(update={"pools": [first]})


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.config.checks import MAX_POOL_NODES

    if not (
        1 <= args.nodes <= MAX_POOL_NODES
        and 1 <= args.gpus_per_node <= 16
        and math.isfinite(args.hours)
        and 0 < args.hours <= 24 * 7
    ):
        print(
            f"error: need 1 <= --nodes <= {MAX_POOL_NODES}, 1 <= --gpus-per-node <= 16 and"
            " 0 < --hours <= 168",
            file=sys.stderr,
        )
        return 2
    config = scaled_config(load_config(), args.nodes, args.gpus_per_node)
    setup = build_setup(config)
    epoch = default_epoch(datetime(2026, 1, 5, tzinfo=UTC))
    started = time.perf_counter()
    twin = setup.new_twin(epoch)
    create_s = time.perf_counter() - started
    until = epoch + int(args.hours * 3600)
    started = time.perf_counter()
    twin.advance(until, emit_samples=False)
    events_s = time.perf_counter() - started
    # the samples alone: one synthesis pass over the same span at the end state
    ticks = np.arange(
        twin.next_tick, twin.next_tick + int(args.hours * 3600 // setup.params.sample_interval_s)
    )
    started = time.perf_counter()
    twin.emit_ticks(ticks)
    frame, _, _ = twin.take_outputs()
    samples_s = time.perf_counter() - started
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus": args.nodes * args.gpus_per_node,
                "hours": args.hours,
                "sample_rows": 0 if frame is None else frame.height,
                "sample_synthesis_seconds": round(samples_s, 3),
                "event_processing_seconds": round(events_s, 3),
                "create_seconds": round(create_s, 3),
                "events": dict(twin.stats),
                "note": "2 shared CPU cores; other helpers ran concurrently",
            }
        )
    )
    return 0
