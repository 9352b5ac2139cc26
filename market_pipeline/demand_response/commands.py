"""CLI of the demand response: `demand fit` (its benches are the lab's, `lab.demand_response.commands`).

`market-pipeline demand fit --history CSV --json` fits every pool x class of a CSV with the
columns `ts, pool_id, resource_class, price, demand` (ts ISO UTC, 5-minute or hourly steps) and
prints one JSON object keyed "<pool_id>/<resource_class>", each value with `elasticity`
(positive: demand falls as the price rises), `elasticity_low`, `elasticity_high` (the 80%
interval) and `observations` (plus how it was fitted). It is the estimator the loop uses.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from market_pipeline.cli.support import input_error, number

EXIT_OK = 0


def register(sub: argparse._SubParsersAction) -> None:
    demand = sub.add_parser("demand", help="demand response: how tenants answer prices")
    demand_sub = demand.add_subparsers(dest="demand_command", required=True)
    fit = demand_sub.add_parser("fit", help="fit the elasticity per pool x class from a (price, demand) CSV")
    fit.add_argument("--history", required=True, help="CSV: ts, pool_id, resource_class, price, demand")
    fit.add_argument(
        "--level",
        type=number(float, low=0, high=1, low_open=True, high_open=True),
        default=0.8,
        help="interval level (default 0.8)",
    )
    fit.add_argument(
        "--lag-hours",
        type=float,
        help="distributed-lag window: the long-run elasticity (default: demand_response.lag_hours)",
    )
    fit.add_argument(
        "--structure-alpha",
        type=float,
        default=None,
        help="false-keep rate of the lag and cycle tests, in (0, 1]; 1 keeps them always "
        "(default: demand_response.structure_alpha)",
    )
    fit.add_argument("--json", action="store_true", help="print one JSON object")
    fit.set_defaults(handler=run_fit)


def run_fit(args: argparse.Namespace) -> int:
    from market_pipeline.config import ConfigError, load_config
    from market_pipeline.demand_response.estimator import DemandResponseInputError
    from market_pipeline.demand_response.history import fit_history, read_history_csv

    try:
        if not 0 < args.level < 1:
            raise DemandResponseInputError(f"--level must be in (0, 1), got {args.level}")
        dr = load_config(resolve_fleet=False).demand_response  # the loop's estimator settings
        lag = dr.lag_hours if args.lag_hours is None else args.lag_hours
        if not (0 <= lag <= 48):
            raise DemandResponseInputError(f"--lag-hours must be in [0, 48], got {lag}")
        alpha = dr.structure_alpha if args.structure_alpha is None else args.structure_alpha
        if not (0 < alpha <= 1):
            raise DemandResponseInputError(f"--structure-alpha must be in (0, 1], got {alpha}")
        fits = fit_history(
            read_history_csv(args.history),
            level=args.level,
            lag_hours=lag,
            daily_cycle=dr.daily_cycle,
            structure_alpha=alpha,
        )
    except (DemandResponseInputError, ConfigError) as exc:
        return input_error(exc)
    out = {key: fit_json(f) for key, f in fits.items()}
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print(f"{'pool/class':40s} {'elasticity':>10s} {'80% interval':>20s} {'obs':>7s}  method")
    for key, row in out.items():
        e, lo, hi = row["elasticity"], row["elasticity_low"], row["elasticity_high"]
        interval = "-" if lo is None else f"[{lo:.3f}, {hi:.3f}]"
        print(
            f"{key:40s} {'-' if e is None else f'{e:.3f}':>10s} {interval:>20s} {row['observations']:>7d}  "
            f"{row['method']}{' (' + row['reason'] + ')' if row['reason'] else ''}"
        )
    return EXIT_OK


def fit_json(fit) -> dict[str, Any]:
    def num(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else round(float(v), 6)

    return {
        "elasticity": num(fit.elasticity),
        "elasticity_low": num(fit.elasticity_low),
        "elasticity_high": num(fit.elasticity_high),
        "elasticity_cos": num(fit.elasticity_cos),
        "elasticity_sin": num(fit.elasticity_sin),
        "lag_hours": fit.lag_hours,
        "observations": fit.observations,
        "std_error": num(fit.std_error),
        "method": fit.method,
        "hour_bins": fit.hour_bins,
        "price_spread": num(fit.price_spread),
        "reason": fit.reason,
    }
