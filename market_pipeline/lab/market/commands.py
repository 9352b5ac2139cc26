"""The solver's benches: `market-pipeline bench solver --tenants N --resources M [--baseline]
[--device cpu|cuda] --json` and `market-pipeline bench global [--suite | --tenants N --resources M]
[--starts 100] --json` (`solve` is the live package's, `market.commands`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from market_pipeline.cli.support import input_error
from market_pipeline.market.errors import InstanceError
from market_pipeline.market.report import SolverSettings

if TYPE_CHECKING:
    pass


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser("solver", help="equilibrium solver on a seeded random instance")
    bench.add_argument("--tenants", type=int, required=True)
    bench.add_argument("--resources", type=int, required=True)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--baseline", action="store_true", help="also run the nested SciPy solver")
    bench.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    bench.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="rounds of one engine solve then one baseline solve (the fastest of each is reported)",
    )
    bench.add_argument(
        "--threads",
        type=int,
        default=SolverSettings.threads,
        help="torch threads on CPU during the solve (default %(default)s)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(handler=run_bench)
    glob = bench_sub.add_parser(
        "global",
        help="cold solve (global phase) against the best of many SLSQP starts, "
        "on coupled instances (binding budgets)",
    )
    glob.add_argument(
        "--suite",
        action="store_true",
        help="2-8 resources x 30-400 tenants, loose and tight capacity (some with bands)",
    )
    glob.add_argument("--tenants", type=int, default=60)
    glob.add_argument("--resources", type=int, default=3)
    glob.add_argument("--seed", type=int, default=0)
    glob.add_argument("--seeds", type=int, default=2, help="seeds per suite instance")
    glob.add_argument("--tight", action="store_true", help="capacity 50-80%% of the budgeted demand")
    glob.add_argument(
        "--drainable", action="store_true", help="guaranteed/drainable pairs with a discount band"
    )
    glob.add_argument("--starts", type=int, default=100, help="independent SLSQP starts of the reference")
    glob.add_argument("--json", action="store_true", help="print one JSON object")
    glob.set_defaults(handler=run_bench_global)


# What `solve` accepts from a file: the leader's Hessian is M x M (10^6 resources asked for
# terabytes before falling back) and the demand work buffers are N x M.
def _reset_peak_rss() -> int | None:
    """Reset the process's peak RSS (Linux: /proc/self/clear_refs) and return the current
    RSS in bytes, or None where that is not available."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_bytes("VmRSS")
    except OSError:
        return None


def _status_bytes(field: str) -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    return None


def _timed(run):
    """(result, process CPU seconds): on a shared host CPU time is the load-independent measure."""
    started = time.process_time()
    result = run()
    return result, time.process_time() - started


def run_bench(args: argparse.Namespace) -> int:
    from market_pipeline.lab.market.generate import random_problem
    from market_pipeline.market.solve import resolve_device, solve_equilibrium
    from market_pipeline.market.workspace import pooled_bytes

    try:
        if args.tenants < 1 or args.resources < 1 or args.repeat < 1:
            raise InstanceError("--tenants, --resources and --repeat must be >= 1")
        print(f"building instance {args.tenants} x {args.resources} (seed {args.seed})", file=sys.stderr)
        problem = random_problem(args.tenants, args.resources, args.seed)
        if args.threads is not None and args.threads < 1:
            raise InstanceError("--threads must be >= 1")
        settings = SolverSettings(threads=args.threads)
        # warm-up on a small other instance: library initialisation only; nothing of the timed
        # problem is cached (its first solve allocates its own buffers)
        solve_equilibrium(
            random_problem(min(args.tenants, 1000), args.resources, args.seed + 1),
            device=args.device,
            settings=SolverSettings(threads=args.threads, max_iterations=2),
        )
        if args.baseline:
            from market_pipeline.lab.market.baseline import solve_baseline

            print("running the engine and the nested SciPy baseline, alternately", file=sys.stderr)
        # Engine and baseline alternate, so that both are timed in the same stretches of a
        # shared host's speed (a VM's CPU allotment drifts by tens of percent over seconds).
        timed, runs, peaks = [], [], []
        for _ in range(args.repeat):
            before = _reset_peak_rss()
            timed.append(_timed(lambda: solve_equilibrium(problem, device=args.device, settings=settings)))
            peak = _status_bytes("VmHWM") if before is not None else None
            peaks.append(None if peak is None else peak - before)
            if args.baseline:
                runs.append(_timed(lambda: solve_baseline(problem)))
    except InstanceError as exc:
        return input_error(exc)
    report = min((r for r, _ in timed), key=lambda r: r.seconds)
    reports = [r for r, _ in timed]
    out = {
        "tenants": args.tenants,
        "resources": args.resources,
        "seconds": report.seconds,
        "kkt_residual": report.kkt_residual,
        "profit": report.profit,
        "converged": report.converged,
        "iterations": report.iterations,
        "follower_kkt": report.follower_kkt,
        "status": report.status,
        "device": report.device,
        "seed": args.seed,
        "threads": args.threads,
        "repeat": args.repeat,
        "seconds_all": [r.seconds for r in reports],
        "cpu_seconds": min(c for _, c in timed),
    }
    # memory: the (N, M) work buffers the solve keeps, and the process's peak RSS above its
    # RSS before each solve (the first solve allocates the buffers; later ones reuse them)
    cells = args.tenants * args.resources
    workspace = pooled_bytes(args.resources, resolve_device(args.device))
    out.update(
        {
            "workspace_bytes": workspace,
            "workspace_bytes_per_cell": workspace / cells,
            "peak_rss_delta_bytes": peaks[0],
            "peak_rss_delta_bytes_per_cell": None if peaks[0] is None else peaks[0] / cells,
        }
    )
    if args.baseline:
        base = min((b for b, _ in runs), key=lambda b: b.seconds)
        base_cpu = min(c for _, c in runs)
        out.update(
            {
                "baseline_seconds": base.seconds,
                "baseline_profit": base.profit,
                "baseline_cpu_seconds": base_cpu,
                "baseline_success": base.success,
                "baseline_evaluations": base.evaluations,
                "speedup": base.seconds / report.seconds,
                "cpu_speedup": base_cpu / out["cpu_seconds"],
                "speedup_by_round": [b.seconds / r.seconds for (r, _), (b, _) in zip(timed, runs)],
                "profit_gap": (report.profit - base.profit) / abs(base.profit) if base.profit else None,
            }
        )
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
    return 0


SUITE = ((2, 30), (3, 60), (4, 100), (6, 200), (8, 400))
TARGET_GAP = 1e-3  # the engine's profit within 0.1% of the reference's best


def _global_case(tenants: int, resources: int, seed: int, tight: bool, drainable: bool, starts: int) -> dict:
    from market_pipeline.lab.market.generate import coupled_problem
    from market_pipeline.lab.market.reference import reference_optimum
    from market_pipeline.market.solve import solve_equilibrium

    problem = coupled_problem(tenants, resources, seed, tight=tight, drainable=drainable)
    report = solve_equilibrium(problem)
    ref = reference_optimum(problem, starts=starts, seed=seed)
    gap = (report.profit - ref.profit) / abs(ref.profit) if np.isfinite(ref.profit) and ref.profit else None
    return {
        "tenants": tenants,
        "resources": resources,
        "seed": seed,
        "tight": tight,
        "drainable": drainable,
        "status": report.status,
        "profit": report.profit,
        "seconds": report.seconds,
        "starts": report.starts,
        "distinct_optima": report.distinct_optima,
        "alternative_gap": report.alternative_gap,
        "screened_prices": report.screened_prices,
        "reference_profit": ref.profit,
        "reference_starts": starts,
        "reference_feasible": int(np.isfinite(ref.profits).sum()),
        "reference_seconds": ref.seconds,
        "gap": gap,
        "within_target": report.converged and gap is not None and gap >= -TARGET_GAP,
    }


def run_bench_global(args: argparse.Namespace) -> int:
    if args.starts < 1 or args.tenants < 1 or args.resources < 1 or args.seeds < 1:
        return input_error("--starts, --tenants, --resources and --seeds must be >= 1")
    if args.suite:
        cases = [
            (n, m, seed, tight, m >= 4 and seed % 2 == 1)
            for m, n in SUITE
            for tight in (False, True)
            for seed in range(args.seeds)
        ]
    else:
        cases = [(args.tenants, args.resources, args.seed, args.tight, args.drainable)]
    rows = []
    for n, m, seed, tight, drainable in cases:
        print(f"instance {m} x {n} seed {seed} tight={tight} drainable={drainable}", file=sys.stderr)
        rows.append(_global_case(n, m, seed, tight, drainable, args.starts))
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    out = {
        "instances": rows,
        "worst_gap": min(gaps) if gaps else None,
        "all_within_target": all(r["within_target"] for r in rows),
        "target_gap": -TARGET_GAP,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for r in rows:
            print(
                f"{r['resources']} x {r['tenants']} seed {r['seed']} tight={r['tight']} drainable={r['drainable']}: "
                f"profit {r['profit']:.6g} reference {r['reference_profit']:.6g} gap {r['gap']:.2e} "
                f"starts {r['starts']} optima {r['distinct_optima']}"
            )
        print(f"worst gap {out['worst_gap']}, all within target: {out['all_within_target']}")
    return 0
