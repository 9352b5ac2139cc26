"""`market-pipeline fleet status|advance` (the simulated fleet); its bench, `bench fleet-telemetry`,
is the lab's (`lab.fleet.commands`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from datetime import datetime, timedelta

from market_pipeline.config import ConfigError, load_config
from market_pipeline.fleet.catalog import FleetSourceError
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
