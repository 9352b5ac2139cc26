"""Where the fleet's history begins: the first hour the loop's time partitions cover.

Dagster's hourly partitions (telemetry, metering, billing) start here rather than at a fixed
date, so an operator sees the hours the fleet actually lived and "materialize all" means that
history, not years of empty partitions. The simulated twin keeps its epoch in its state file
(written when the twin is first created); before that, the epoch it will be created with.
MARKET_PIPELINE_HISTORY_START (an ISO time) pins the start instead: a warehouse that holds
older history than the fleet's adapter, or a test suite whose fixtures use fixed dates.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet.setup import default_epoch
from market_pipeline.fleet.state import TwinStateError
from market_pipeline.fleet.store import TwinStore, configured_blobs
from market_pipeline.warehouse.errors import WarehouseError

HISTORY_START_ENV = "MARKET_PIPELINE_HISTORY_START"


def history_start(config: MarketPipelineConfig) -> datetime:
    """The hour (UTC) the fleet's history begins."""
    pinned = os.environ.get(HISTORY_START_ENV)
    start = _pinned(pinned) if pinned else None
    if start is None and config.adapter.backend == "simulated":
        start = _stored_epoch(config)
    if start is None:
        start = config.adapter.sim_epoch or datetime.fromtimestamp(default_epoch(), UTC)
    return start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _pinned(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{HISTORY_START_ENV}={text!r} is not an ISO time such as 2026-11-01T00:00:00Z"
        ) from None
    if moment.tzinfo is None:
        raise ValueError(f"{HISTORY_START_ENV}={text!r} needs a UTC offset, e.g. 2026-11-01T00:00:00Z")
    return moment


def _stored_epoch(config: MarketPipelineConfig) -> datetime | None:
    try:
        blobs = configured_blobs(config, migrate=False)
        state = TwinStore(config.resolve_path(config.adapter.state_path), blobs=blobs).read_state()
    except (TwinStateError, WarehouseError):
        # a broken state, or a control PostgreSQL without one yet or out of reach: the adapter
        # reports it where it is used; partitions need not
        return None
    if not state or "epoch_ts" not in state:
        return None
    return datetime.fromtimestamp(int(state["epoch_ts"]), UTC)


def configured_history_start() -> datetime:
    """history_start of the configured fleet; with a config that does not load (reported
    where it is used), the epoch a new simulated twin would get."""
    from market_pipeline.config import ConfigError, load_config

    try:
        config = load_config(resolve_fleet=False)
    except ConfigError:
        pinned = os.environ.get(HISTORY_START_ENV)
        return _pinned(pinned) if pinned else datetime.fromtimestamp(default_epoch(), UTC)
    return history_start(config)
