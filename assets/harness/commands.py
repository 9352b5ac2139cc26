"""`market-pipeline demo` and `market-pipeline bench soak`: the commands that drive the Dagster
instance (registered in market_pipeline/cli/__init__.py; Dagster is imported only when they run)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from typing import Iterator

SOAK_TARGETS = {"runs_min": 100, "tick_p95_max_s": 30.0}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="the control loop over simulated days through the Dagster instance (what `make demo` runs)",
    )
    parser.add_argument("--days", type=float, default=1.0, help="simulated days (default 1)")
    parser.add_argument("--json", help="also write the summary to this JSON file")
    parser.set_defaults(handler=_demo)


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser(
        "soak",
        help="the loop on dagster-postgres, every schedule and sensor on, the fleet on an accelerated clock",
    )
    parser.add_argument("--minutes", type=float, default=20.0, help="wall minutes to soak (default 20)")
    parser.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="go on past --minutes until the daemon has taken this many steps (a slow or loaded machine "
        "still soaks a known amount of work; default 0)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument(
        "--pg-admin-url",
        default=None,
        help="PostgreSQL URL of a database to CREATE/DROP the soak's database from "
        "(default postgresql://postgres@127.0.0.1:5432/test)",
    )
    parser.set_defaults(handler=_soak)
    _register_scale(bench_sub)


def _register_scale(bench_sub: argparse._SubParsersAction) -> None:
    scale = bench_sub.add_parser(
        "scale",
        help="control ticks per hour on the cluster profile with 1 and N Celery workers (same run); "
        "--decisions-only: the control state alone",
    )
    scale.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    scale.add_argument("--rounds", type=int, default=1, help="runs per count, alternating; median kept")
    scale.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    whole = scale.add_argument_group("whole ticks (the default)")
    whole.add_argument(
        "--fleet-source",
        default=None,
        help="node list CSV of the fleet (default: the Alibaba spot trace's 4,278 nodes under ../shared/data)",
    )
    whole.add_argument(
        "--lanes",
        type=int,
        default=None,
        help="independent cells ticking side by side (default: twice the largest worker count, "
        "at most 8, so that every count is measured saturated)",
    )
    whole.add_argument("--ticks", type=int, default=2, help="ticks per lane (default 2)")
    whole.add_argument(
        "--pg-admin-url",
        default=None,
        help="PostgreSQL URL to CREATE/DROP the bench's databases from "
        "(default postgresql://postgres@127.0.0.1:5432/test)",
    )
    proxy = scale.add_argument_group("--decisions-only (the control state's claims and journal alone)")
    proxy.add_argument("--decisions-only", action="store_true", help="measure the control state alone")
    proxy.add_argument("--batches", type=int, default=40, help="batches of decisions (default 40)")
    proxy.add_argument("--per-batch", type=int, default=25, help="decisions per batch (default 25)")
    proxy.add_argument(
        "--act-ms", type=float, default=20.0, help="one action's adapter call, ms (default 20)"
    )
    proxy.add_argument(
        "--control-url", default=None, help="the control PostgreSQL (default: the configured one)"
    )
    proxy.add_argument(
        "--schema-prefix", default="bench_scale", help="the scratch schemas' prefix (dropped afterwards)"
    )
    scale.set_defaults(handler=_scale)


def _demo(args: argparse.Namespace) -> int:
    from assets.harness.demo import main

    return main(["--days", str(args.days), *(["--json", args.json] if args.json else [])])


def _soak(args: argparse.Namespace) -> int:
    if not 0 < args.minutes <= 24 * 60:
        print(f"error: --minutes must be in (0, 1440], got {args.minutes}", file=sys.stderr)
        return 2
    if not 0 <= args.min_steps <= 100_000:
        print(f"error: --min-steps must be in [0, 100000], got {args.min_steps}", file=sys.stderr)
        return 2
    from assets.harness.soak import PG_ADMIN_URL, run_soak

    try:
        import psycopg2

        psycopg2.connect(args.pg_admin_url or PG_ADMIN_URL).close()
    except Exception as exc:  # noqa: BLE001 - any connection problem is the user's to fix
        print(
            f"error: PostgreSQL not reachable at {args.pg_admin_url or PG_ADMIN_URL}: "
            f"{' '.join(str(exc).split())}",
            file=sys.stderr,
        )
        return 2
    with _stdout_to_stderr():  # runs and dbt print; stdout carries the JSON only
        result = run_soak(
            args.minutes, min_steps=args.min_steps, admin_url=args.pg_admin_url or PG_ADMIN_URL
        ).as_dict()
    result["targets"] = {
        "runs_ge_100": result["runs"] >= SOAK_TARGETS["runs_min"],
        "no_failed_runs": result["failed_runs"] == 0,
        "no_duplicate_actions": result["duplicate_actions"] == 0,
        "no_lock_errors": result["lock_errors"] == 0,
        "no_lost_rows": result["lost_rows"] == 0,
        "tick_p95_le_30s": result["tick_p95_s"] <= SOAK_TARGETS["tick_p95_max_s"],
    }
    print(json.dumps(result))
    return 0


def _scale(args: argparse.Namespace) -> int:
    """Whole ticks through Dagster on Celery workers (assets/harness/scale_ticks.py), or with
    --decisions-only the control state alone (the lab's bench)."""
    if args.decisions_only:
        from market_pipeline.lab.commands import run_bench_scale

        return run_bench_scale(args)
    from pathlib import Path

    from assets.harness.scale_ticks import SPOT_FLEET, WholeTickSettings, run_whole_tick_bench
    from assets.harness.soak import PG_ADMIN_URL
    from market_pipeline.cli.support import bench_counts, input_error

    try:
        workers = bench_counts(args.workers, args.rounds, most=8)
    except ValueError as exc:
        return input_error(exc)
    # Throughput is measured saturated: each lane is a chain (a tick's runs, a run's steps, one
    # after another, with the broker's hand-offs between them), so with as many lanes as
    # workers a worker idles in every hand-off of its lane; two lanes a worker keep it fed.
    lanes = args.lanes if args.lanes is not None else min(8, 2 * max(workers))
    if not (1 <= lanes <= 8 and 1 <= args.ticks <= 100):
        return input_error(f"--lanes must be in 1..8 and --ticks in 1..100, got {lanes} and {args.ticks}")
    fleet = Path(args.fleet_source) if args.fleet_source else SPOT_FLEET
    if not fleet.is_file():
        return input_error(f"--fleet-source: no node list at {fleet}")
    admin = args.pg_admin_url or PG_ADMIN_URL
    try:
        import psycopg2

        psycopg2.connect(admin).close()
    except Exception as exc:  # noqa: BLE001 - any connection problem is the user's to fix
        return input_error(f"PostgreSQL not reachable at {admin}: {exc}")
    settings = WholeTickSettings(
        fleet_source=str(fleet.resolve()),
        workers=workers,
        lanes=lanes,
        ticks=args.ticks,
        rounds=args.rounds,
        admin_url=admin,
    )
    with _stdout_to_stderr():  # runs and workers print; stdout carries the JSON only
        result = run_whole_tick_bench(settings)
    print(json.dumps(result))
    return 0


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
