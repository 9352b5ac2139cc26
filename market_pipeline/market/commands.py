"""CLI: `market-pipeline solve --instance FILE.json [--json]` (its benches, `bench solver` and
`bench global`, are the lab's: `lab.market.commands`)."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from market_pipeline.bounded_input import InputFileError, read_text_bounded
from market_pipeline.cli.support import input_error
from market_pipeline.market.errors import InstanceError
from market_pipeline.market.report import SolverSettings

if TYPE_CHECKING:
    from market_pipeline.market.problem import MarketProblem


def register(sub: argparse._SubParsersAction) -> None:
    solve = sub.add_parser("solve", help="Stackelberg equilibrium prices for a market instance (JSON file)")
    solve.add_argument(
        "--instance", required=True, help="instance JSON file (see market_pipeline.market.instance)"
    )
    solve.add_argument("--json", action="store_true", help="print one JSON object")
    solve.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    solve.add_argument("--last-prices", help="JSON object {resource name: price}: warm start and fallback")
    solve.add_argument(
        "--max-step", type=float, help="max relative price move from --last-prices (0.25 = 25%%)"
    )
    solve.add_argument("--tolerance", type=float, default=SolverSettings.tolerance, help="KKT tolerance")
    solve.set_defaults(handler=run_solve)


MAX_INSTANCE_RESOURCES = 4096
MAX_INSTANCE_CELLS = 20_000_000
MAX_INSTANCE_BYTES = 512 * 1024 * 1024
DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:[0-9]{1,2})?)$")


def _load_instance(path: str) -> "MarketProblem":
    from market_pipeline.market.problem import MarketProblem

    file = Path(path)
    try:
        data = json.loads(read_text_bounded(file, "--instance", MAX_INSTANCE_BYTES))
    except InputFileError as exc:
        raise InstanceError(str(exc)) from None
    except FileNotFoundError:
        raise InstanceError(f"--instance: file not found: {path}") from None
    except IsADirectoryError:
        raise InstanceError(f"--instance: {path} is a directory, not a JSON file") from None
    except UnicodeDecodeError:
        raise InstanceError(f"--instance: {path} is not UTF-8 text (a binary file?)") from None
    except OSError as exc:
        raise InstanceError(f"--instance: cannot read {path}: {exc.strerror or exc}") from None
    except RecursionError:
        raise InstanceError(f"--instance: {path} is nested too deeply to be an instance") from None
    except json.JSONDecodeError as exc:
        raise InstanceError(f"--instance: {path} is not valid JSON ({exc})") from None
    _check_size(data)
    return MarketProblem.from_instance_json(data)


def _check_size(data: object) -> None:
    """Refuse instances too large to solve before any buffer is allocated."""
    if not isinstance(data, dict):
        return  # the instance parser names the problem
    resources, tenants = data.get("resources"), data.get("tenants")
    m = len(resources) if isinstance(resources, list) else 0
    n = len(tenants) if isinstance(tenants, list) else 0
    if m > MAX_INSTANCE_RESOURCES:
        raise InstanceError(f"--instance: {m} resources; at most {MAX_INSTANCE_RESOURCES} are solved")
    if n * m > MAX_INSTANCE_CELLS:
        raise InstanceError(
            f"--instance: {n} tenants x {m} resources = {n * m} cells;"
            f" at most {MAX_INSTANCE_CELLS} are solved"
        )


def _last_prices(problem: MarketProblem, text: str | None) -> np.ndarray | None:
    if text is None:
        return None
    try:
        keyed = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InstanceError(f"--last-prices: not valid JSON ({exc})") from None
    if not isinstance(keyed, dict) or set(keyed) != set(problem.resource_names):
        raise InstanceError(
            f"--last-prices: expected an object with exactly the resources {list(problem.resource_names)}"
        )
    prices = []
    for name in problem.resource_names:
        value = keyed[name]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InstanceError(f"--last-prices: {name!r} must be a finite positive number, got {value!r}")
        prices.append(float(value))
    return np.array(prices)


def _check_solve_args(args: argparse.Namespace) -> None:
    if not DEVICE_PATTERN.match(args.device):
        raise InstanceError(f"--device: expected 'cpu' or 'cuda' (or 'cuda:N'), got {args.device!r}")
    if args.device.startswith("cuda:"):
        import torch

        if torch.cuda.is_available() and int(args.device[5:]) >= torch.cuda.device_count():
            raise InstanceError(
                f"--device {args.device}: this host has {torch.cuda.device_count()} CUDA device(s)"
            )
    if not (math.isfinite(args.tolerance) and 0 < args.tolerance < 1):
        raise InstanceError(f"--tolerance must be a finite number in (0, 1), got {args.tolerance}")
    if args.max_step is not None and not (math.isfinite(args.max_step) and 0 < args.max_step <= 10):
        raise InstanceError(f"--max-step must be a finite number in (0, 10], got {args.max_step}")


def _finite(value: object) -> object:
    """The report with every non-finite float as null: strict JSON, never NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run_solve(args: argparse.Namespace) -> int:
    from market_pipeline.market.solve import solve_equilibrium

    try:
        _check_solve_args(args)
        problem = _load_instance(args.instance)
        report = solve_equilibrium(
            problem,
            last_prices=_last_prices(problem, args.last_prices),
            max_step=args.max_step,
            settings=SolverSettings(tolerance=args.tolerance),
            device=args.device,
        )
    except InstanceError as exc:
        return input_error(exc)
    failed = report.status == "fallback"
    if args.json:
        # the status is in the JSON; a fallback (last prices, not an equilibrium) exits 1
        print(json.dumps(_finite(report.to_dict()), allow_nan=False))
        return 1 if failed else 0
    print(
        f"status {report.status}  profit {report.profit:.6g}  KKT {report.kkt_residual:.2e}  "
        f"iterations {report.iterations}  {report.seconds:.3f}s"
    )
    for name, price, demand, cap in zip(report.resource_names, report.prices, report.demand, report.capacity):
        print(f"  {name:32s} price {price:10.4f}  demand {demand:12.4f}  capacity {cap:12.4f}")
    if report.fallback_reason:
        print(f"fallback: {report.fallback_reason}")
    return 1 if failed else 0
