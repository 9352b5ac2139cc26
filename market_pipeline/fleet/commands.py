"""`market-pipeline fleet status|advance` (the simulated fleet) and
`market-pipeline bench fleet-telemetry` (sample synthesis and event processing speed)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np

from market_pipeline.config import ConfigError, MarketPipelineConfig, load_config
from market_pipeline.fleet.catalog import FleetSourceError
from market_pipeline.fleet.setup import build_setup, default_epoch
from market_pipeline.fleet.shapes import WorkloadError
from market_pipeline.fleet.state import TwinStateError

_ERRORS = (ConfigError, FleetSourceError, WorkloadError, TwinStateError, ValueError, OverflowError)
MAX_ADVANCE_HOURS = 24 * 366  # one call moves the twin's clock at most a year


def _check_hours(hours: float, flag: str = "--hours") -> float:
    if not (math.isfinite(hours) and 0 < hours <= MAX_ADVANCE_HOURS):
        raise ValueError(f"{flag} must be a finite number in (0, {MAX_ADVANCE_HOURS}], got {hours}")
    return hours


def register(sub: argparse._SubParsersAction) -> None:
    fleet = sub.add_parser("fleet", help="the simulated fleet (digital twin) behind the simulated adapter")
    fsub = fleet.add_subparsers(dest="fleet_command", required=True)
    status = fsub.add_parser("status", help="clock, nodes per pool and state, tasks, queue")
    status.add_argument("--config", help="TOML config (default: shipped defaults or MARKET_PIPELINE_CONFIG)")
    status.set_defaults(handler=run_status)
    advance = fsub.add_parser("advance", help="move the simulated clock forward")
    advance.add_argument("--config")
    group = advance.add_mutually_exclusive_group(required=True)
    group.add_argument("--hours", type=float, help="hours past the current clock")
    group.add_argument("--until", help="ISO-8601 UTC time, e.g. 2026-01-05T12:00:00+00:00")
    advance.set_defaults(handler=run_advance)


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser(
        "fleet-telemetry", help="twin speed on a large fleet (default 1,000 x 8 GPUs, 1 h)"
    )
    bench.add_argument("--nodes", type=int, default=1000)
    bench.add_argument("--gpus-per-node", type=int, default=8)
    bench.add_argument("--hours", type=float, default=1.0)
    bench.set_defaults(handler=run_bench)


def _adapter(args: argparse.Namespace):  # noqa: ANN202 - SimulatedAdapter, imported lazily
    from market_pipeline.fleet.twin_adapter import SimulatedAdapter

    return SimulatedAdapter.from_config(load_config(args.config))


def _status(adapter) -> dict:  # noqa: ANN001
    nodes = adapter.list_nodes()
    per_pool: dict[str, Counter] = {}
    for node in nodes:
        per_pool.setdefault(node.pool_id, Counter())[
            node.state.value + ("/cordoned" if node.cordoned else "")
        ] += 1
    tasks = adapter.list_tasks()
    return {
        "clock": adapter.now().isoformat(),
        "epoch": adapter.epoch_time().isoformat(),
        "nodes": {pool: dict(counts) for pool, counts in sorted(per_pool.items())},
        "running_tasks": len(tasks),
        "running_gpus": round(sum(t.gpus for t in tasks), 3),
        "pending": adapter.pending_summary(),
        "stats": adapter.stats(),
    }


def run_status(args: argparse.Namespace) -> int:
    try:
        print(json.dumps(_status(_adapter(args))))
    except _ERRORS as exc:
        print(f"error: fleet status: {exc}", file=sys.stderr)
        return 2
    return 0


def run_advance(args: argparse.Namespace) -> int:
    try:
        adapter = _adapter(args)
        if args.hours is not None:
            until = adapter.now() + timedelta(hours=_check_hours(args.hours))
        else:
            until = datetime.fromisoformat(args.until)
            if until.tzinfo is None:
                raise ValueError(f"--until {args.until!r} needs a UTC offset, e.g. 2026-01-05T12:00:00+00:00")
            _check_hours(max((until - adapter.now()).total_seconds() / 3600, 1e-9), "--until (hours ahead)")
        started = time.perf_counter()
        adapter.advance(until)
        out = _status(adapter)
        out["seconds"] = round(time.perf_counter() - started, 3)
        print(json.dumps(out))
    except _ERRORS as exc:
        print(f"error: fleet advance: {exc}", file=sys.stderr)
        return 2
    return 0


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
