"""Numeric sanity of a validated configuration: finite everywhere, physical where it can be.

Pydantic accepts `inf` and `nan` for a float field and has no upper bound unless one is
written, so `solver_tolerance = inf`, `temp_min_c = nan`, `price_max = inf` and
`nodes = 1e8` (after which `fleet status` died with MemoryError) all loaded. These checks run
on the model `load_config` built and return every problem with its key path, so one
ConfigError names them all. Bounds are generous physical limits, not tuning: a pool of more
than MAX_POOL_NODES nodes, a GPU with more than a TiB of memory, or a GPU-hour priced above
MAX_PRICE_PER_GPU_HOUR is a typo, not a fleet.
"""

from __future__ import annotations

import math
import zoneinfo
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from market_pipeline.config.model import MarketPipelineConfig

MAX_POOL_NODES = 10_000  # nodes in one pool (nodes, warm_nodes, max_nodes)
MAX_FLEET_GPUS = 1_000_000  # GPUs over all pools at max_nodes
MAX_PRICE_PER_GPU_HOUR = 1_000.0  # list prices, bounds and costs of a GPU-hour
MAX_GPU_MEMORY_MIB = 1024 * 1024
TEMPERATURE_RANGE_C = (-40.0, 150.0)  # what a GPU sensor can physically report
MAX_SOLVER_ITERATIONS = 100_000


def _numbers(value: Any, path: str) -> Iterator[tuple[str, float]]:
    """(key path, value) of every float or int in a model, recursively."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _numbers(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{path}.{i}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def non_finite(config: BaseModel) -> list[str]:
    return [
        f"{path}: must be a finite number, got {value}"
        for path, value in _numbers(config, "")
        if isinstance(value, float) and not math.isfinite(value)
    ]


def _at_most(problems: list[str], path: str, value: float, bound: float, what: str) -> None:
    if math.isfinite(value) and value > bound:
        problems.append(f"{path}: {value:g} is more than {bound:g} ({what})")


def physical(config: MarketPipelineConfig) -> list[str]:
    """Bounds on nodes, GPUs, memory, prices, temperatures and the solver's budget."""
    problems: list[str] = []
    fleet_gpus = 0
    for i, pool in enumerate(getattr(config, "pools", ())):
        for name in ("nodes", "warm_nodes", "max_nodes"):
            _at_most(problems, f"pools.{i}.{name}", getattr(pool, name), MAX_POOL_NODES, "nodes per pool")
        for name in ("price_min", "price_max", "base_price"):
            _at_most(
                problems, f"pools.{i}.{name}", getattr(pool, name), MAX_PRICE_PER_GPU_HOUR, "per GPU-hour"
            )
        fleet_gpus += min(pool.max_nodes, MAX_POOL_NODES) * pool.gpus_per_node
    if fleet_gpus > MAX_FLEET_GPUS:
        problems.append(f"pools: {fleet_gpus} GPUs at max_nodes; at most {MAX_FLEET_GPUS}")
    for i, model in enumerate(getattr(config, "gpu_models", ())):
        _at_most(problems, f"gpu_models.{i}.memory_mib", model.memory_mib, MAX_GPU_MEMORY_MIB, "1 TiB")
        _at_most(
            problems,
            f"gpu_models.{i}.cost_per_gpu_hour",
            model.cost_per_gpu_hour,
            MAX_PRICE_PER_GPU_HOUR,
            "per GPU-hour",
        )
    telemetry = getattr(config, "telemetry", None)
    if telemetry is not None:
        low, high = TEMPERATURE_RANGE_C
        for name in ("temp_min_c", "temp_max_c"):
            value = getattr(telemetry, name)
            if math.isfinite(value) and not low <= value <= high:
                problems.append(f"telemetry.{name}: {value:g} C is outside [{low:g}, {high:g}] C")
        zone = getattr(telemetry, "naive_timezone", None)
        if zone is not None and not _is_zone(zone):
            problems.append(
                f"telemetry.naive_timezone: {zone!r} is not an IANA time zone (e.g. 'Asia/Shanghai')"
            )
        if telemetry.temp_min_c >= telemetry.temp_max_c:
            problems.append(
                f"telemetry: temp_min_c ({telemetry.temp_min_c:g}) must be below"
                f" temp_max_c ({telemetry.temp_max_c:g})"
            )
    market = getattr(config, "market", None)
    if market is not None:
        if math.isfinite(market.solver_tolerance) and market.solver_tolerance >= 1:
            problems.append(f"market.solver_tolerance: {market.solver_tolerance:g} must be below 1")
        _at_most(
            problems,
            "market.solver_max_iterations",
            market.solver_max_iterations,
            MAX_SOLVER_ITERATIONS,
            "iterations",
        )
    return problems


def _is_zone(name: str) -> bool:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def config_problems(config: BaseModel) -> list[str]:
    """Every numeric problem of `config`, each naming its key; empty when it is sane."""
    return non_finite(config) + physical(config)
