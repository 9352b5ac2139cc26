"""Typed configuration of the control loop: one TOML file plus env overrides.

Resolution order: the shipped `defaults/market.toml`, or the file named by
MARKET_PIPELINE_CONFIG; then every `MP__SECTION__KEY=value` env var overrides one scalar
(`__` separates nesting levels). Validation happens at load; any problem raises one
`ConfigError` naming the key path and the problem. The types live in `config.model`.
"""

from __future__ import annotations

import copy
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from market_pipeline.bounded_input import InputFileError, read_text_bounded
from market_pipeline.config.checks import config_problems

# The types are this package's interface (`from market_pipeline.config import Pool`).
from market_pipeline.config.model import (  # noqa: F401
    HOME_ENV,
    AdapterConfig,
    BacklogGuardrailConfig,
    BillingConfig,
    Claim,
    CommitmentTier,
    ConfigError,
    DemandResponseConfig,
    DisruptionBudgetConfig,
    GpuModel,
    GuardrailsConfig,
    LoopConfig,
    MarketConfig,
    MarketPipelineConfig,
    Pool,
    ScalingConfigSection,
    ServiceConfig,
    TaskDrainGuardrailConfig,
    TelemetryConfig,
    Tenant,
    WarehouseConfig,
    Zone,
)

DEFAULT_CONFIG_PATH = Path(__file__).parents[1] / "defaults" / "market.toml"
CONFIG_ENV = "MARKET_PIPELINE_CONFIG"
OVERRIDE_PREFIX = "MP__"


def _format_validation_error(source: str, error: ValidationError, overrides: Mapping[str, str]) -> str:
    """One line naming every bad key; a key an environment variable set is blamed on that
    variable (its value shown), not on the file."""
    problems, from_file = [], False
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(_blame(key, message, overrides))
        from_file |= _override_of(key, overrides) is None
    where = f"in {source}" if from_file else "from the environment"
    return f"invalid configuration {where}: " + "; ".join(problems)


def _override_of(key: str, overrides: Mapping[str, str]) -> str | None:
    """The environment variable that set `key` (or a section above it), if one did."""
    parts = key.split(".")
    for depth in range(len(parts), 0, -1):
        name = overrides.get(".".join(parts[:depth]))
        if name is not None:
            return name
    return None


def _blame(key: str, message: str, overrides: Mapping[str, str]) -> str:
    name = _override_of(key, overrides)
    if name is None:
        return f"{key}: {message}"
    return f"{key} (set by environment variable {name}): {message}"


def _blame_problem(problem: str, overrides: Mapping[str, str]) -> str:
    """A `config_problems` line names its key first ("market.max_price_step ..."): blame the
    environment variable that set it."""
    key = problem.split(" ", 1)[0].rstrip(":")
    name = _override_of(key, overrides)
    return problem if name is None else f"{problem} (set by environment variable {name})"


def override_keys(environ: Mapping[str, str]) -> dict[str, str]:
    """dotted config key -> the MP__ variable that sets it."""
    return {
        ".".join(part.lower() for part in name[len(OVERRIDE_PREFIX) :].split("__") if part): name
        for name in environ
        if name.startswith(OVERRIDE_PREFIX)
    }


def _parse_scalar(raw: str) -> Any:
    """Env values are TOML/JSON scalars where they parse, strings otherwise."""
    lowered = raw.strip().lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Apply every MP__A__B=value override to a copy of the raw config mapping."""
    merged = copy.deepcopy(data)  # not a JSON round trip: TOML datetimes (sim_epoch) are not JSON
    for name, raw in sorted(environ.items()):
        if not name.startswith(OVERRIDE_PREFIX):
            continue
        path = [part.lower() for part in name[len(OVERRIDE_PREFIX) :].split("__") if part]
        if not path:
            raise ConfigError(f"env override {name}: names no key")
        node = merged
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"env override {name}: {part!r} is not a section")
            node = child
        node[path[-1]] = _parse_scalar(raw)
    return merged


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None, *, resolve_fleet: bool = True
) -> MarketPipelineConfig:
    """Load, override and validate the configuration; raise ConfigError on any problem.

    With `resolve_fleet` (the default) the pools, GPU models and tenants are the fleet's
    (`fleet.market_fleet.resolve_fleet_market`): a node list's models must all be priced."""
    environ = os.environ if environ is None else environ
    source = Path(path or environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)
    try:
        raw = tomllib.loads(read_text_bounded(source, "config file"))
    except InputFileError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, a binary file, no permission
        raise ConfigError(f"config file {source} cannot be read as TOML text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {source} is not valid TOML: {exc}") from exc
    merged = apply_env_overrides(raw, environ)
    try:
        config = MarketPipelineConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(str(source), exc, override_keys(environ))) from None
    if problems := config_problems(config):  # finite, and physical where a bound is
        overrides = override_keys(environ)
        blamed = [_blame_problem(problem, overrides) for problem in problems]
        raise ConfigError(f"invalid configuration in {source}: " + "; ".join(blamed))
    return _with_fleet_market(config) if resolve_fleet else config


def _with_fleet_market(config: MarketPipelineConfig) -> MarketPipelineConfig:
    from market_pipeline.fleet.market_fleet import fleet_market  # it reads this module's types

    return fleet_market(config)
