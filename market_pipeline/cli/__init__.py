"""The `market-pipeline` command.

Each concern registers its own subcommands (and `bench` targets) from a `commands`
module, so this file only composes them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from types import ModuleType

from market_pipeline.bounded_input import InputFileError
from market_pipeline.cli.support import INPUT_ERROR, OneLineParser, bound_numbers, input_error

# Exit statuses: INPUT_ERROR (2) is bad input (one line on stderr, from the command itself); 70
# (EX_SOFTWARE) is a defect that escaped a command, reported as one line unless TRACEBACK_ENV is set.
INTERNAL_ERROR = 70
TRACEBACK_ENV = "MARKET_PIPELINE_TRACEBACK"

# The domain's modules exposing `register(sub)` and optionally `register_bench(bench_sub)`.
COMMAND_MODULES: tuple[str, ...] = (
    "market_pipeline.cli.core",
    "market_pipeline.drain.commands",
    "market_pipeline.forecast.commands",
    "market_pipeline.lab.forecast.commands",
    "market_pipeline.market.commands",
    "market_pipeline.lab.market.commands",
    "market_pipeline.telemetry.commands",
    "market_pipeline.lab.telemetry.commands",
    "market_pipeline.lab.scaling.commands",
    "market_pipeline.fleet.commands",
    "market_pipeline.lab.fleet.commands",
    "market_pipeline.lab.placement.commands",
    "market_pipeline.lab.simulate.commands",
    "market_pipeline.billing.commands",
    "market_pipeline.lab.billing.commands",
    "market_pipeline.billing.export",
    "market_pipeline.demand_response.commands",
    "market_pipeline.lab.demand_response.commands",
    "market_pipeline.lab.commands",
    "market_pipeline.hardware.slurm.commands",
    "market_pipeline.lab.slurm.commands",
    "market_pipeline.service.commands",
    "market_pipeline.lab.service.commands",
)
# Layers above the domain (assets/harness/: demo, bench soak and bench loop drive the Dagster
# instance) add theirs as entry points of this group (pyproject.toml), so the domain never
# imports them.
COMMAND_ENTRY_POINTS = "market_pipeline.commands"


def command_modules() -> list[ModuleType]:
    """The domain's command modules, then those registered as entry points (by name). An entry
    point naming a module this checkout does not have (an install older than a move) is left
    out with one warning line, so the other commands still run; a module that is there but
    fails to import is a defect and raises."""
    modules = [importlib.import_module(name) for name in COMMAND_MODULES]
    for entry_point in sorted(entry_points(group=COMMAND_ENTRY_POINTS), key=lambda ep: ep.name):
        try:
            modules.append(entry_point.load())
        except ModuleNotFoundError as exc:
            if not exc.name or not (entry_point.module + ".").startswith(exc.name + "."):
                raise
            print(
                f"warning: the {entry_point.name!r} commands are installed as {entry_point.module}, "
                "which this checkout does not have: reinstall the project (pip install -e . --no-deps)",
                file=sys.stderr,
            )
    return modules


def input_errors() -> tuple[type[BaseException], ...]:
    """The domain's exceptions that mean "the input is bad" (a file, a value, a name a user
    gave), wherever in a command they surface: one `error:` line and exit 2, never the
    internal-error exit. A defect (anything else) still exits 70."""
    from market_pipeline.billing.errors import BillingError
    from market_pipeline.config import ConfigError
    from market_pipeline.demand_response.estimator import DemandResponseInputError
    from market_pipeline.fleet.catalog import FleetSourceError
    from market_pipeline.fleet.shapes import WorkloadError
    from market_pipeline.fleet.state import TwinStateError
    from market_pipeline.forecast.settings import ForecastInputError, ForecastSettingsError
    from market_pipeline.gpus.catalog import UnpricedModelError
    from market_pipeline.hardware import AdapterBackendError
    from market_pipeline.hardware.dcgm.adapter import DcgmSourceError
    from market_pipeline.hardware.dcgm.exposition import ExpositionError
    from market_pipeline.lab.scaling.forecast import ForecastInputError as ScalingForecastInputError
    from market_pipeline.lab.scaling.load import LoadFileError
    from market_pipeline.lab.simulate.errors import SimulationInputError
    from market_pipeline.market.errors import InstanceError
    from market_pipeline.placement.capacity import PlacementError
    from market_pipeline.scaling.types import ScalingError
    from market_pipeline.telemetry.partitions import PartitionKeyError
    from market_pipeline.telemetry.schema import TelemetryInputError
    from market_pipeline.warehouse import WarehouseError

    return (
        InputFileError,
        BillingError,
        ConfigError,
        DemandResponseInputError,
        FleetSourceError,
        UnpricedModelError,
        WorkloadError,
        TwinStateError,
        ForecastInputError,
        ForecastSettingsError,
        AdapterBackendError,
        DcgmSourceError,
        ExpositionError,
        InstanceError,
        PlacementError,
        ScalingForecastInputError,
        LoadFileError,
        ScalingError,
        SimulationInputError,
        PartitionKeyError,
        TelemetryInputError,
        WarehouseError,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="market-pipeline",
        description="Control plane of a multi-tenant GPU cloud.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks against a baseline, JSON output")
    bench_sub = bench.add_subparsers(dest="bench_target", required=True)
    for module in command_modules():
        module.register(sub)
        register_bench = getattr(module, "register_bench", None)
        if register_bench is not None:
            register_bench(bench_sub)
    bound_numbers(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (its one line is printed): a status
        return exc.code if isinstance(exc.code, int) else INPUT_ERROR
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"no handler for command {args.command!r}")
    try:
        return int(handler(args) or 0)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except input_errors() as exc:  # bad input that reached the top: still one line, exit 2
        return input_error(exc)
    except (RecursionError, MemoryError) as exc:
        # the input was too deep or too large for what the command builds from it
        print(f"error: the input is too large or too deeply nested ({type(exc).__name__})", file=sys.stderr)
        return INPUT_ERROR
    except Exception as exc:  # the last net: a user never sees a traceback
        if os.environ.get(TRACEBACK_ENV):
            raise
        text = " ".join(str(exc).split())[:300]
        print(
            f"error: internal error in {args.command} ({type(exc).__name__}: {text});"
            f" set {TRACEBACK_ENV}=1 for the traceback",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
