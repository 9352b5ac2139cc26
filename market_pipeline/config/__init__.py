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
    TaskDrainGuardrailConfig,
    TelemetryConfig,
    Tenant,
    WarehouseConfig,
    Zone,
)

DEFAULT_CONFIG_PATH = Path(__file__).parents[1] / "defaults" / "market.toml"
CONFIG_ENV = "MARKET_PIPELINE_CONFIG"
OVERRIDE_PREFIX = "MP__"


def _format_validation_error(source: str, error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(f"{key}: {message}")
    return f"invalid configuration in {source}: " + "; ".join(problems)


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
        raise ConfigError(_format_validation_error(str(source), exc)) from None
    if problems := config_problems(config):  # finite, and physical where a bound is
        raise ConfigError(f"invalid configuration in {source}: " + "; ".join(problems))
    return _with_fleet_market(config) if resolve_fleet else config


def _with_fleet_market(config: MarketPipelineConfig) -> MarketPipelineConfig:
    from market_pipeline.fleet.market_fleet import fleet_market  # it reads this module's types

    return fleet_market(config)
