"""The live loop's side of the market tick: its inputs from the warehouse, its record
(`market_ticks`) and the price-book rows it publishes.

`equilibrium_prices` runs the tick and stores one `market_ticks` row per pool; `price_book`
publishes those rows' prices (the shielded ones, with the solver's beside them and the
reason); `scaling_plan` sizes each pool to the tick's capacity target at its equilibrium
price. Nothing here decides: the decisions are `tick.market_tick`'s.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick.certificate import backlog_params_from_config
from market_pipeline.tick.market_tick import AS_SOLVED, HOLD_PREFIX, MarketTick, PoolTickInput
from market_pipeline.tick.pricing import mid_band_discount, resource_name
from market_pipeline.tick.promises import Promises, guarantee_reach, guaranteed_window
from market_pipeline.tick.state import capacity_horizon_minutes
from market_pipeline.warehouse import Warehouse
from market_pipeline.warehouse.readers import (
    fleet_gpus_by_pool,
    forecast_upper_by_pool,
    guarantee_backing_by_pool,
    last_certified_prices,
    latest_demand_by_pool,
    typical_demand_by_pool,
)

EXPERIMENT_REASON = "price experiment"
NO_EVIDENCE = "no demand observed in this pool yet (cold start): nothing to price on"
DRAINABLE_FOLLOWS_SHIELD = "follows the guaranteed shield"  # market_tick's drainable reason
TICK_SCHEMA = {
    "tick_at": pl.Datetime("us", "UTC"),
    "solve_id": pl.Utf8,
    "pool_id": pl.Utf8,
    "status": pl.Utf8,
    "list_price": pl.Float64,
    "solver_guaranteed": pl.Float64,
    "solver_drainable": pl.Float64,
    "guaranteed": pl.Float64,
    "drainable": pl.Float64,
    "guaranteed_reason": pl.Utf8,
    "drainable_reason": pl.Utf8,
    "certified": pl.Boolean,
    "margin": pl.Float64,
    "required_margin": pl.Float64,
    "serving_gpus": pl.Float64,
    "capacity_target_gpus": pl.Float64,
    "equilibrium_price": pl.Float64,
    "shield_factor": pl.Float64,
    "demand_gpus": pl.Float64,
    "backlog_gpus": pl.Float64,
    "forecast_upper_gpus": pl.Float64,
    "shadow": pl.Boolean,
    "reachable_gpus": pl.Float64,
}


def list_prices(config: MarketPipelineConfig, pool_id: str) -> tuple[float, float]:
    """(guaranteed, drainable) list prices: the pool's base price, drainable mid-band."""
    base = config.pool_by_id[pool_id].base_price
    return base, base * (1 - mid_band_discount(config))


def prices_in_force(config: MarketPipelineConfig, store: Warehouse) -> dict[str, float]:
    """Per resource, the latest published price, else its list price (the first solve's step
    counts from the base price)."""
    booked = last_certified_prices(store)
    out = {}
    for pool in config.pools:
        for cls, price in zip((GUARANTEED, DRAINABLE), list_prices(config, pool.pool_id)):
            name = resource_name(pool.pool_id, cls)
            out[name] = float(booked.get(name, price))
    return out


def pool_tick_inputs(
    config: MarketPipelineConfig,
    store: Warehouse,
    now: datetime,
    in_force: dict[str, float],
    serving: dict[str, float],
) -> list[PoolTickInput]:
    """What the tick needs per configured pool: powered GPUs, every GPU the pool can reach,
    demand and backlog now, the forecast's upper quantile over the horizon the policy needs
    (`capacity_horizon_minutes`: an hour with the default settings)."""
    demand = latest_demand_by_pool(store, now)
    backing = guarantee_backing_by_pool(store, now)
    upper = forecast_upper_by_pool(store, now, capacity_horizon_minutes(config))
    reachable = fleet_gpus_by_pool(store)
    evidence = typical_demand_by_pool(store, now)  # pools with demand observed since the first snapshot
    return [
        pool_tick_input(
            config,
            pool.pool_id,
            in_force,
            serving_gpus=float(serving.get(pool.pool_id, 0.0)),
            fleet_gpus=reachable.get(pool.pool_id) or 0.0,
            observed=demand.get(pool.pool_id),
            forecast_upper=upper.get(pool.pool_id),
            has_evidence=pool.pool_id in evidence,
            reach=guarantee_reach(*backing[pool.pool_id]) if pool.pool_id in backing else 1.0,
        )
        for pool in config.pools
    ]


def pool_tick_input(
    config: MarketPipelineConfig,
    pool_id: str,
    in_force: dict[str, float],
    *,
    serving_gpus: float,
    fleet_gpus: float,
    observed: tuple[float, float] | None,
    forecast_upper: float | None,
    has_evidence: bool,
    reach: float = 1.0,
) -> PoolTickInput:
    """One pool's tick input from what the loop observed: powered GPUs, the pool's GPUs in the
    fleet, (demand, pending) now, the forecast's upper quantile, whether any demand was
    ever observed (without, the pool holds its prices: a cold start has nothing to price on),
    and the share of the guaranteed premium its guarantee backs (`guarantee_reach`).
    The live loop reads these from the warehouse; `bench ticks` from the twin it drives."""
    pool = config.pool_by_id[pool_id]
    now_demand, pending = observed or (0.0, 0.0)
    g = in_force[resource_name(pool_id, GUARANTEED)]
    return PoolTickInput(
        pool_id=pool_id,
        list_price=pool.base_price,
        price_min=pool.price_min,
        price_max=pool.price_max,
        node_gpus=float(pool.gpus_per_node),
        serving_gpus=serving_gpus,
        reachable_gpus=float(max(fleet_gpus, pool.max_nodes * pool.gpus_per_node)),
        demand_gpus=max(now_demand, 0.0),
        backlog_gpus=max(pending, 0.0),
        forecast_upper_gpus=max(float(forecast_upper or now_demand), 0.0),
        in_force_guaranteed=g,
        in_force_drainable=in_force[resource_name(pool_id, DRAINABLE)],
        forecast_price=g,  # the demand history (so the forecast) was observed at the prices in force
        backlog=backlog_params_from_config(config, pool_id),
        hold_reason=None if has_evidence else NO_EVIDENCE,
        guarantee_reach=reach,
    )


def next_price_ceilings(config: MarketPipelineConfig, in_force: dict[str, float]) -> dict[str, float]:
    """Per pool, the most the next tick may publish for the guaranteed class (its promise
    window from the price now in force): what the scaling plan may count on pricing for."""
    promises = Promises.from_config(config)
    return {
        p.pool_id: guaranteed_window(
            in_force[resource_name(p.pool_id, GUARANTEED)], p.base_price, p.price_min, p.price_max, promises
        ).high
        for p in config.pools
    }


def tick_rows(tick: MarketTick, tick_at: datetime, solve_id: str, shadow: bool) -> pl.DataFrame:
    rows = [
        {**r.to_dict(), "tick_at": tick_at, "solve_id": solve_id, "status": tick.status, "shadow": shadow}
        for r in tick.pools
    ]
    return pl.DataFrame(rows, schema=TICK_SCHEMA) if rows else pl.DataFrame(schema=TICK_SCHEMA)


def price_source(
    status: str, reason: str, shield_factor: float, certified: bool, resource_class: str = GUARANTEED
) -> str:
    """How the published price of one class came about: solver, shield (it raised the price,
    or found no price within the promises that certifies), experiment (a bounded price
    experiment moved it), promises (clipped), fallback or the solve's status.

    The guaranteed price answers for the pool's shield and certificate. The drainable price
    is judged by its own reason: it is "shield" only where it followed the guaranteed shield,
    so an uncertified pool's drainable price as solved is the solver's."""
    if status not in ("converged", "list"):
        return "fallback" if status == "fallback" else status
    if resource_class == DRAINABLE:
        if DRAINABLE_FOLLOWS_SHIELD in reason:
            return "shield"
    elif shield_factor > 1 + 1e-9 or not certified:
        return "shield"
    if EXPERIMENT_REASON in reason:  # a bounded price experiment (`demand_response.experiments`)
        return "experiment"
    if reason.startswith(HOLD_PREFIX):  # no evidence to price on: the prices in force stay
        return "hold"
    return "solver" if reason.startswith(AS_SOLVED) else "promises"


def published_rows(config: MarketPipelineConfig, tick: pl.DataFrame) -> pl.DataFrame:
    """Price-book rows from a tick: the published price, the list and the solver's price beside it."""
    rows = []
    for r in tick.iter_rows(named=True):
        pool = config.pool_by_id.get(r["pool_id"])
        if pool is None:
            continue
        g_list, d_list = list_prices(config, pool.pool_id)
        for cls, price, solver, reason, listed in (
            (GUARANTEED, r["guaranteed"], r["solver_guaranteed"], r["guaranteed_reason"], g_list),
            (DRAINABLE, r["drainable"], r["solver_drainable"], r["drainable_reason"], d_list),
        ):
            rows.append(
                price_row(
                    pool,
                    cls,
                    price,
                    r["tick_at"],
                    r["solve_id"],
                    price_source(r["status"], reason, r["shield_factor"], r["certified"], cls),
                    listed,
                    solver,
                    reason,
                )
            )
    return price_frame(rows)


def base_price_rows(config: MarketPipelineConfig, effective_from: datetime) -> pl.DataFrame:
    """The list prices: the price book before the first tick."""
    rows = []
    for pool in config.pools:
        for cls, price in zip((GUARANTEED, DRAINABLE), list_prices(config, pool.pool_id)):
            rows.append(
                price_row(
                    pool,
                    cls,
                    price,
                    effective_from,
                    "config-base-price",
                    "config",
                    price,
                    None,
                    "list price before the first tick",
                )
            )
    return price_frame(rows)


def price_row(
    pool,
    resource_class: str,
    price: float,
    effective_from: datetime,
    solve_id: str,
    source: str,
    list_price: float,
    solver_price: float | None,
    reason: str,
) -> dict:
    return {
        "effective_from": effective_from,
        "pool_id": pool.pool_id,
        "gpu_model": pool.gpu_model,
        "zone": pool.zone,
        "resource_class": resource_class,
        "price_per_gpu_hour": round(price, 6),
        "solve_id": solve_id,
        "source": source,
        "list_price_per_gpu_hour": round(list_price, 6),
        "solver_price_per_gpu_hour": None if solver_price is None else round(solver_price, 6),
        "intervention_reason": reason,
    }


def price_frame(rows: list[dict]) -> pl.DataFrame:
    money = pl.Decimal(18, 6)
    schema = {
        "effective_from": pl.Datetime("us", "UTC"),
        "pool_id": pl.Utf8,
        "gpu_model": pl.Utf8,
        "zone": pl.Utf8,
        "resource_class": pl.Utf8,
        "price_per_gpu_hour": money,
        "solve_id": pl.Utf8,
        "source": pl.Utf8,
        "list_price_per_gpu_hour": money,
        "solver_price_per_gpu_hour": money,
        "intervention_reason": pl.Utf8,
    }
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
