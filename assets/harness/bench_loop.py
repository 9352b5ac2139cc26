"""`market-pipeline bench loop`: the control loop operators run (`market-pipeline demo`, real
Dagster runs, in a child process with a fresh home) on a fleet, timed: the median control tick, a simulated day projected from the
hours run, failed runs and the billing reconciliation, against the embedded default fleet
run the same way (`--baseline`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from market_pipeline.cli.support import input_error

REPO_ROOT = Path(__file__).resolve().parents[2]


def register(sub: argparse._SubParsersAction) -> None:  # no top-level command of its own
    return None


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser("loop", help="the control loop on a fleet through Dagster runs, timed")
    parser.add_argument("--fleet-source", default="config", help="node-list CSV (openb or spot) or 'config'")
    parser.add_argument("--workload-source", default="builtin", help="openb pod-list CSV or 'builtin'")
    parser.add_argument("--hours", type=float, default=3.0, help="simulated hours to run (default 3)")
    parser.add_argument("--tick-target-s", type=float, default=30.0, help="target median control tick (s)")
    parser.add_argument(
        "--day-target-s", type=float, default=1200.0, help="target wall per simulated day (s)"
    )
    parser.add_argument("--baseline", action="store_true", help="also run the embedded default fleet")
    parser.set_defaults(handler=run_loop_bench)


def run_loop_bench(args: argparse.Namespace) -> int:
    if not 0 < args.hours <= 48:
        return input_error(f"--hours must be in (0, 48], got {args.hours}")
    result: dict[str, Any] = {"fleet": _run(args.fleet_source, args.workload_source, args.hours)}
    if "error" in result["fleet"]:
        return input_error(f"{result['fleet']['error']}")
    if args.baseline:
        result["baseline"] = _run("config", "builtin", args.hours)
    wall = result["fleet"]["wall"]
    rec = result["fleet"]["billing_reconciliation"]
    result["targets"] = {
        "control_tick_median_le_target": wall["control_tick_median_s"] <= args.tick_target_s,
        "simulated_day_le_target": wall["simulated_day_projected_s"] <= args.day_target_s,
        "no_failed_runs": result["fleet"]["failed_runs"] == 0,
        "billing_reconciles": rec["unrated_intervals"] == 0
        and rec["rated_seconds"] == rec["metered_seconds"],
    }
    print(json.dumps(result))
    return 0


def _run(fleet_source: str, workload_source: str, hours: float) -> dict[str, Any]:
    """One run of `python -m assets.harness.demo` in a fresh home; its JSON summary."""
    with tempfile.TemporaryDirectory(prefix="loop-bench-") as home:
        dagster_home = Path(home) / "dagster_home"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
        out = Path(home) / "summary.json"
        env = {
            **os.environ,
            "MARKET_PIPELINE_HOME": home,
            "DAGSTER_HOME": str(dagster_home),
            "MP__ADAPTER__FLEET_SOURCE": str(Path(fleet_source).resolve())
            if fleet_source != "config"
            else "config",
            "MP__ADAPTER__WORKLOAD_SOURCE": (
                str(Path(workload_source).resolve()) if workload_source != "builtin" else "builtin"
            ),
        }
        done = subprocess.run(
            [sys.executable, "-m", "assets.harness.demo", "--days", str(hours / 24), "--json", str(out)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if not out.exists():
            lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
            return {"error": lines[-1][len("error: ") :] if lines else f"the loop exited {done.returncode}"}
        summary = json.loads(out.read_text())
        keep = (
            "nodes",
            "gpus",
            "solves",
            "solves_converged",
            "failed_runs",
            "wall",
            "billing_reconciliation",
        )
        return {"source": fleet_source, **{k: summary[k] for k in keep}}
