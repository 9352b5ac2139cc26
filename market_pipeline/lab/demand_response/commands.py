"""The demand response's benches: `bench demand` and `bench demand-structure` (`demand fit` is the
live package's, `demand_response.commands`).

`market-pipeline bench demand` prints one JSON object: the estimator's recovery on synthetic
14-day histories (several elasticities) and the truth grid (`grid_run`) with its targets.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from market_pipeline.cli.support import input_error

EXIT_OK, EXIT_BAD_INPUT = 0, 2
RECOVERY_ELASTICITIES = (0.2, 0.5, 1.0, 2.0, 3.0)
RECOVERY_TOLERANCE = 0.15
# last turn's `market-pipeline simulate --latent-elastic-ratio 1`, 7 days openb (README)
LATENT_DEMAND_REFERENCE = {
    "revenue_x": 1.19,
    "utilisation": 0.872,
    "elastic_cost_x": 0.525,
    "rigid_cost_x": 1.04,
    "source": "simulate --latent-elastic-ratio 1, 7 days openb (issue #20's run)",
}


def register(sub: argparse._SubParsersAction) -> None:
    """No top-level subcommand: only benches."""


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    parser = bench_sub.add_parser("demand", help="demand-response recovery and the truth grid, JSON")
    parser.add_argument("--days", type=int, default=3, help="simulated days of the loop (default 3)")
    parser.add_argument("--history-days", type=int, default=7, help="days at list prices before (default 7)")
    parser.add_argument("--points", choices=("judged", "tuning", "all"), default="judged")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--amplitude", type=float, default=0.05, help="experiment dither (default 0.05)")
    parser.add_argument("--shadow", action="store_true", help="experiments recorded, not published")
    parser.add_argument("--no-ablation", action="store_true", help="skip the claims-only loop per point")
    parser.add_argument("--full", action="store_true", help="every point's full record, not just the table")
    parser.set_defaults(handler=run_bench)
    structure = bench_sub.add_parser(
        "demand-structure",
        help="the fit's lag/cycle selection and interval coverage on seeded synthetic histories, JSON",
    )
    structure.add_argument("--histories", type=int, default=100, help="per seed set, half with structure")
    structure.add_argument(
        "--alpha", type=float, default=None, help="judge this structure_alpha (default: the config's)"
    )
    structure.add_argument("--rows", action="store_true", help="every history's fit, not just the summary")
    structure.set_defaults(handler=run_structure_bench)


def run_structure_bench(args: argparse.Namespace) -> int:
    from market_pipeline.config import ConfigError, load_config
    from market_pipeline.lab.demand_response.structure_bench import judge, tune

    if not 2 <= args.histories <= 2000:
        return input_error(f"--histories must be in 2..2000, got {args.histories}")
    try:
        configured = load_config(resolve_fleet=False).demand_response.structure_alpha
    except ConfigError as exc:
        return input_error(exc)
    alpha = configured if args.alpha is None else args.alpha
    if not (math.isfinite(alpha) and 0 < alpha <= 1):
        return input_error(f"--alpha must be in (0, 1], got {alpha}")
    started = time.perf_counter()
    tuning = tune(args.histories)
    judged = judge(args.histories, alpha)
    if not args.rows:
        judged.pop("rows")
    out = {
        "tuning": tuning,
        "judged": judged,
        "configured_alpha": configured,
        "note": "structure_alpha is chosen on the tuning seeds and judged on the others; even seeds carry a "
        "3-hour deferral lag and a daily cycle, odd seeds neither",
        "wall_s": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(out, indent=2))
    return EXIT_OK


def recovery(step_minutes: int = 5, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """The estimator on synthetic 14-day histories (price leaning into the load, +-5% dither),
    with the loop's settings (the config's defaults: the lag window, its keep threshold, the
    daily cycle)."""
    from market_pipeline.config.model import DemandResponseConfig
    from market_pipeline.demand_response.history import fit_history
    from market_pipeline.lab.demand_response.synthetic import HistoryParams, synthetic_history

    dr = DemandResponseConfig()
    rows = []
    for e in RECOVERY_ELASTICITIES:
        for seed in seeds:
            history = synthetic_history(HistoryParams(e, step_minutes=step_minutes, seed=seed))
            fits = fit_history(
                history,
                lag_hours=dr.lag_hours,
                daily_cycle=dr.daily_cycle,
                structure_alpha=dr.structure_alpha,
            )
            fit = next(iter(fits.values()))
            rows.append(
                {
                    "true": e,
                    "seed": seed,
                    "fit": round(fit.elasticity, 4),
                    "low": round(fit.elasticity_low, 4),
                    "high": round(fit.elasticity_high, 4),
                    "relative_error": round(abs(fit.elasticity / e - 1), 4),
                }
            )
    return {
        "step_minutes": step_minutes,
        "days": 14,
        "dither": 0.05,
        "fits": rows,
        "worst_relative_error": max(r["relative_error"] for r in rows),
        "interval_coverage": sum(r["low"] <= r["true"] <= r["high"] for r in rows) / len(rows),
        "within_15pct": all(r["relative_error"] <= RECOVERY_TOLERANCE for r in rows),
    }


def seed_table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed's table per truth point: the loop (and the clairvoyant) against static."""
    out = []
    for p in points:
        row = {
            "point": p["point"],
            "regret": round(p["regret_share"], 4),
            "experiment_cost_share": round(p["experiment_cost_share"], 4),
        }
        for who in ("loop", "clairvoyant"):
            v = p[f"{who}_vs_static"]
            row[who] = {
                k: round(v[k], 3)
                for k in ("revenue_x", "profit_x", "utilisation", "elastic_cost_x", "rigid_cost_x")
            }
        if "claims_only_regret_share" in p:
            row["claims_only_regret"] = round(p["claims_only_regret_share"], 4)
        out.append(row)
    return out


def run_bench(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from market_pipeline.demand_response.experiments import ExperimentSettings, ExperimentSettingsError
    from market_pipeline.lab.demand_response.grid_run import run_grid
    from market_pipeline.lab.demand_response.truth import judged_points, tuning_points
    from market_pipeline.lab.demand_response.truth_grid import GridSettings

    if not (1 <= args.days <= 14 and 1 <= args.history_days <= 28):
        return input_error("--days must be in 1..14 and --history-days in 1..28")
    try:
        experiments = replace(ExperimentSettings(), amplitude=args.amplitude)
    except ExperimentSettingsError as exc:
        return input_error(f"--amplitude: {exc}")
    points = {"judged": judged_points(), "tuning": tuning_points(), "all": judged_points() + tuning_points()}[
        args.points
    ]
    settings = GridSettings(
        days=args.days,
        history_days=args.history_days,
        seed=args.seed,
        shadow=args.shadow,
        experiments=experiments,
    )
    started = time.perf_counter()
    fits = recovery()
    recovery_s = time.perf_counter() - started
    grid = run_grid(points, settings, ablation=not args.no_ablation)
    out = {
        "recovery": fits,
        "truth_grid": grid["summary"],
        "seed_table": seed_table(grid["points"]),
        "latent_demand_reference": LATENT_DEMAND_REFERENCE,
        "held_out": "no setting was fitted to the judged points (docs/history/demand_response_tuning.md); tuning points: "
        + ", ".join(p.name for p in tuning_points()),
        "wall_s": {
            "recovery": round(recovery_s, 2),
            "truth_grid": round(time.perf_counter() - started - recovery_s, 2),
        },
    }
    out["targets"] = {"recovery_within_15pct": fits["within_15pct"], **grid["summary"]["targets"]}
    if args.full:
        out["points"] = grid["points"]
    print(json.dumps(out, indent=2))
    return EXIT_OK
