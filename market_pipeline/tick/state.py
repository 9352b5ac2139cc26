"""The live tick's clock and what the pricing step writes between ticks (its reads are
`market_pipeline.warehouse.readers`)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import polars as pl

from market_pipeline.market.report import SolveReport
from market_pipeline.warehouse.decision_inputs import PriceInputs
from market_pipeline.warehouse.decisions import DecisionAction, DecisionKind, DecisionRow, decisions_frame

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

FORECAST_HORIZON_MIN = 60
# The demand history's and the forecast's grid: 5-minute steps whatever the tick length
# (loop.tick_minutes divides 60, so a tick falls on a step when it is a multiple of 5).
GRID_MINUTES = 5


def tick_origin(now: datetime, step_minutes: int) -> datetime:
    """`now` floored to the tick grid, so every step of one tick agrees on the time."""
    floored = now.replace(second=0, microsecond=0)
    return floored - timedelta(minutes=floored.minute % step_minutes)


def global_resolve_due(now: datetime, resolve_minutes: int, tick_minutes: int) -> bool:
    """Whether the tick at `now` also solves cold with the global phase (every
    `market.global_resolve_minutes`; 0: never)."""
    return resolve_minutes > 0 and (now.hour * 60 + now.minute) % resolve_minutes < tick_minutes


def solve_record(report: SolveReport, solved_at: datetime, shadow: bool) -> pl.DataFrame:
    body = report.to_dict()
    return pl.DataFrame(
        [
            {
                "solve_id": f"solve-{solved_at:%Y%m%dT%H%M}-{uuid.uuid4().hex[:8]}",
                "solved_at": solved_at,
                "status": str(body.get("status", "converged" if report.converged else "fallback")),
                "converged": bool(report.converged),
                "profit": body.get("profit"),
                "kkt_residual": body.get("kkt_residual"),
                "iterations": int(body.get("iterations") or 0),
                "seconds": float(body.get("seconds") or 0.0),
                "fallback_reason": body.get("fallback_reason"),
                "shadow": shadow,
                "report": json.dumps(body),
            }
        ],
        schema_overrides={
            "solved_at": pl.Datetime("us", "UTC"),
            "profit": pl.Float64,
            "kkt_residual": pl.Float64,
            "fallback_reason": pl.Utf8,
        },
    )


def shadow_price_decisions(rows: pl.DataFrame, decided_at: datetime) -> pl.DataFrame:
    """Shadow mode: the price changes the loop would publish, as decisions it did not execute."""
    return decisions_frame(
        DecisionRow(
            decision_id=f"price-{r['solve_id']}-{r['pool_id']}-{r['resource_class']}",
            kind=DecisionKind.PRICE,
            action=DecisionAction.PUBLISH_PRICE,
            decided_at=decided_at,
            allowed=True,
            shadow=True,
            pool_id=r["pool_id"],
            target=r["resource_class"],
            reasons=("shadow mode: recorded, not published",),
            inputs=PriceInputs(r["price_per_gpu_hour"], r["effective_from"]),
        )
        for r in rows.iter_rows(named=True)
    )


def capacity_horizon_minutes(config: MarketPipelineConfig, step_minutes: int = 5) -> int:
    """How far ahead the policy and the backlog certificate read the forecast's upper quantile.

    A shortfall is priced, not scaled, for up to `scale_up_persistence_minutes`, and a node
    the plan keeps stays at least `hysteresis_minutes` after a `scale_up_cooldown_minutes`:
    the capacity decided now must hold for the longer of the two, and never less than the
    hour (`FORECAST_HORIZON_MIN`) the certificate's margins were set against. Rounded up to
    the forecast step, at most the 24 h the forecast stores (60 minutes with the defaults).
    """
    section = config.scaling
    needed = max(
        section.scale_up_persistence_minutes,
        section.hysteresis_minutes + section.scale_up_cooldown_minutes,
        FORECAST_HORIZON_MIN,
        step_minutes,
    )
    return int(min(-(-needed // step_minutes) * step_minutes, 24 * 60))
