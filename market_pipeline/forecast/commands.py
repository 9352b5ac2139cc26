"""CLI of demand forecasting: `forecast backtest`, `forecast pools` (`bench forecast`: `lab.forecast`).

`market-pipeline forecast backtest --series vc6YE.csv --horizon 4h --json` runs the
rolling-origin protocol (backtest.py) on a Helios trace and prints one JSON object with mae,
persistence_mae, seasonal_naive_mae, coverage_80, pinball_loss, chosen_model and origins
(plus extras: refits, chosen_models, daily coverage range, tie floor). Repeat `--series` to
backtest a held-out set in one call: one JSON line per series, or a table without --json.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from market_pipeline.cli.support import input_error, number

EXIT_OK, EXIT_BAD_INPUT = 0, 2
STEP_MINUTES = 5
_DURATION = re.compile(r"^\s*(\d+)\s*(m|min|h)?\s*$", re.IGNORECASE)


def parse_horizon_steps(text: str, step_minutes: int = STEP_MINUTES) -> int:
    """'60m', '1h', '90' (minutes) -> steps of `step_minutes`; must be a whole number of steps."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"horizon {text!r}: expected minutes like 60m or 1h")
    minutes = int(match.group(1)) * (60 if (match.group(2) or "m").lower() == "h" else 1)
    if minutes <= 0 or minutes % step_minutes:
        raise argparse.ArgumentTypeError(
            f"horizon {text!r}: must be a positive multiple of {step_minutes} minutes"
        )
    return minutes // step_minutes


def _learned(text: str) -> tuple[str, ...]:
    from market_pipeline.forecast.settings import KNOWN_LEARNED_MODELS

    names = tuple(name for name in (part.strip() for part in text.split(",")) if name)
    unknown = [name for name in names if name not in KNOWN_LEARNED_MODELS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown learned model(s) {unknown}; known: {', '.join(KNOWN_LEARNED_MODELS)}"
        )
    return names


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number in (0, 1]") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number in (0, 1]")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    forecast = sub.add_parser("forecast", help="demand forecasting per pool")
    forecast_sub = forecast.add_subparsers(dest="forecast_command", required=True)

    backtest = forecast_sub.add_parser(
        "backtest",
        help="rolling-origin backtest on a Helios trace (first 60%% fit, rest "
        "forecast with daily refits and online intervals)",
    )
    backtest.add_argument(
        "--series",
        required=True,
        action="append",
        help="Helios virtual-cluster CSV; repeat it to backtest several clusters (held-out sets)",
    )
    backtest.add_argument(
        "--horizon",
        type=parse_horizon_steps,
        default=12,
        help="forecast horizon, e.g. 60m or 1h (default 60m)",
    )
    backtest.add_argument(
        "--train-fraction",
        type=number(float, low=0, high=1, low_open=True, high_open=True),
        default=0.6,
        help="leading share of points for fitting and model choice",
    )
    backtest.add_argument(
        "--refit-every",
        type=parse_horizon_steps,
        default=None,
        help="refit the model this often, e.g. 24h (default one day)",
    )
    backtest.add_argument(
        "--head-fraction",
        type=_fraction,
        default=1.0,
        help="use only this leading share of the series (tuning on the "
        "first half of a month: 0.5; default 1)",
    )
    backtest.add_argument(
        "--learned",
        type=_learned,
        default=None,
        help="learned candidates, comma separated: ridge,gbm,survival "
        "(default: the settings' ridge,survival)",
    )
    backtest.add_argument("--json", action="store_true", help="print one JSON object (one line per --series)")
    backtest.set_defaults(handler=run_backtest)

    pools = forecast_sub.add_parser("pools", help="forecast every pool of a demand table")
    pools.add_argument("--demand", required=True, help="CSV or Parquet with pool_id, ts, demand [, price]")
    pools.add_argument(
        "--horizon", type=parse_horizon_steps, default=12, help="fine horizon, e.g. 60m (default 60m)"
    )
    pools.add_argument("--out", help="write the long forecast table here (.csv or .parquet)")
    pools.add_argument("--json", action="store_true", help="print one JSON summary object")
    pools.set_defaults(handler=run_pools)


SUMMARY_KEYS = (
    "mae",
    "persistence_mae",
    "seasonal_naive_mae",
    "coverage_80",
    "coverage_80_tie_floor",
    "tie_share",
    "pinball_loss",
    "chosen_model",
    "origins",
)


def run_backtest(args: argparse.Namespace) -> int:
    from market_pipeline.forecast.backtest import backtest_series, load_helios_series
    from market_pipeline.forecast.settings import ForecastInputError, ForecastSettings

    settings = ForecastSettings() if args.learned is None else ForecastSettings(learned_models=args.learned)
    payloads = []
    # Every series is backtested before anything is printed: a bad file is one line and exit 2,
    # never a table with its rows missing.
    for series in args.series:
        try:
            values = load_helios_series(series)
            values = values[: max(1, int(values.size * args.head_fraction))]
            result = backtest_series(
                values,
                horizon_steps=args.horizon,
                train_fraction=args.train_fraction,
                refit_every=args.refit_every,
                settings=settings,
            )
        except (ForecastInputError, OSError) as exc:
            return input_error(f"{series}: {exc}" if len(args.series) > 1 else exc)
        payloads.append({"series": str(series), **result.to_json()})
    if args.json:
        print("\n".join(json.dumps(payload) for payload in payloads))
    elif len(payloads) == 1:
        for key in SUMMARY_KEYS:
            print(f"{key:>21}: {payloads[0][key]}")
    else:
        print(backtest_table(payloads))
    return EXIT_OK


def backtest_table(payloads: list[dict]) -> str:
    """One markdown row per series: coverage against its tie floor, MAE against persistence."""
    lines = [
        "| series | coverage_80 | tie floor | MAE / persistence | chosen model |",
        "|---|---|---|---|---|",
    ]
    for payload in payloads:
        floor = payload["coverage_80_tie_floor"]
        ratio = payload["mae"] / payload["persistence_mae"] if payload["persistence_mae"] else float("nan")
        lines.append(
            f"| {Path(payload['series']).stem} | {payload['coverage_80']:.3f} | "
            f"{'' if floor is None else f'{floor:.3f}'} | {ratio:.3f} | {payload['chosen_model']} |"
        )
    return "\n".join(lines)


def _read_table(path: Path):  # -> pl.DataFrame
    import polars as pl

    from market_pipeline.bounded_input import checked_file
    from market_pipeline.forecast.settings import ForecastInputError

    checked_file(path, "demand table")
    try:
        if path.suffix.lower() == ".parquet":
            return pl.read_parquet(path)
        return pl.read_csv(path, try_parse_dates=True)
    except (pl.exceptions.PolarsError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ForecastInputError(f"demand table {path} cannot be read: {first[:160]}") from None


def run_pools(args: argparse.Namespace) -> int:
    from market_pipeline.forecast.pools import forecast_pool_results, results_frame
    from market_pipeline.forecast.settings import ForecastInputError

    try:
        table = _read_table(Path(args.demand))
        results = forecast_pool_results(table, horizon_steps=args.horizon)
    except (ForecastInputError, OSError) as exc:
        return input_error(exc)
    frame = results_frame(results, table.schema["ts"])
    if args.out:
        out = Path(args.out)
        frame.write_parquet(out) if out.suffix.lower() == ".parquet" else frame.write_csv(out)
    summary = {
        "pools": len(results),
        "rows": frame.height,
        "origin_ts": results[0].origin_ts.isoformat() if results else None,
        "models": dict(Counter(r.forecast.model for r in results)),
        "fallbacks": {r.pool_id: r.forecast.fallback_reason for r in results if r.forecast.fallback_reason},
        "out": args.out,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for result in results:
            forecast = result.forecast
            print(
                f"{result.pool_id}: {forecast.model} q50@{forecast.horizon_minutes[-1]}m="
                f"{forecast.q50[-1]:.1f} [{forecast.q10[-1]:.1f}, {forecast.q90[-1]:.1f}]"
                + (f"  fallback: {forecast.fallback_reason}" if forecast.fallback_reason else "")
            )
    return EXIT_OK
