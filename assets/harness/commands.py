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
