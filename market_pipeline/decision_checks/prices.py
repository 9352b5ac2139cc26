"""Published prices keep their bounds and the promises to tenants (`tick.promises`), checked
on what the price book holds with great-expectations rules, one per promise:

- bounds: price_min..price_max (the drainable floor is price_min less the widest discount);
- guaranteed cap: the guaranteed price at most `guaranteed_price_cap` x list (the
  drainable price at most the cap less the narrowest discount);
- drainable band: `drainable_discount_min..max` below the same pool's guaranteed price;
- max step: at most `max_price_step` from the price in force before this tick, except
  where the step cannot reach the window the other promises leave (they win: the price
  then sits at that window's nearest end, the rule the tick publishes by).
"""

from __future__ import annotations

import sys

import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.gx_frame import RulesReport, validate_frame
from market_pipeline.tick.promises import Promises

TOLERANCE = 1e-6  # the price book keeps 6 decimals
_BIG = sys.float_info.max
PROMISE_RULES = (("bound_low", "bound_high"), ("band_low", "band_high"), ("step_low", "step_high"))


def promise_frame(published: pl.DataFrame, config: MarketPipelineConfig) -> pl.DataFrame:
    """Each published price beside the low and high end every promise allows it."""
    promises = Promises.from_config(config)
    rows = []
    guaranteed = {
        r["pool_id"]: r["price"]
        for r in published.iter_rows(named=True)
        if r["resource_class"] == "guaranteed"
    }
    for r in published.iter_rows(named=True):
        pool = config.pool_by_id.get(r["pool_id"])
        if pool is None:
            rows.append({**_row(r), "bound_low": _BIG, "bound_high": -_BIG})  # an unknown pool fails
            continue
        if r["resource_class"] == "guaranteed":
            bound = (pool.price_min, promises.guaranteed_ceiling(pool.base_price, pool.price_max))
            band = (0.0, _BIG)
        else:
            bound = (
                promises.drainable_floor(pool.price_min),
                promises.drainable_ceiling(pool.base_price, pool.price_max),
            )
            band = promises.band(guaranteed.get(r["pool_id"], float("nan")))
        fixed = (max(bound[0], band[0]), min(bound[1], band[1]))
        step = _step_window(r["previous"], promises, fixed)
        rows.append(
            {
                **_row(r),
                "bound_low": bound[0],
                "bound_high": bound[1],
                "band_low": band[0],
                "band_high": band[1],
                "step_low": step[0],
                "step_high": step[1],
            }
        )
    frame = pl.DataFrame(rows, infer_schema_length=None)
    # the book's rounding: a price 1e-6 past an end keeps its promise
    return frame.with_columns(
        [pl.col(lo) - TOLERANCE for lo, _ in PROMISE_RULES if lo in frame.columns]
        + [pl.col(hi) + TOLERANCE for _, hi in PROMISE_RULES if hi in frame.columns]
    )


def _row(r: dict) -> dict:
    return {
        "resource": f"{r['pool_id']}/{r['resource_class']}",
        "price": r["price"],
        "previous": r["previous"],
        "source": r["source"],
    }


def price_rules(frame: pl.DataFrame) -> RulesReport:
    """great-expectations: prices present, and each between its promise's two ends."""
    import great_expectations.expectations as gxe

    expectations: list[object] = [gxe.ExpectColumnValuesToNotBeNull(column="price")]
    for low, high in PROMISE_RULES:
        if low in frame.columns:
            expectations += [
                gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="price", column_B=low, or_equal=True),
                gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A=high, column_B="price", or_equal=True),
            ]
    return validate_frame(frame, expectations, "price_book_promises")


def _step_window(
    previous: float | None, promises: Promises, fixed: tuple[float, float]
) -> tuple[float, float]:
    if previous is None:
        return 0.0, _BIG  # the first publication: no price in force to step from
    down, up = promises.step_range(previous)
    if down > fixed[1]:
        return fixed[1], fixed[1]  # the step cannot come down into the window: its top wins
    if up < fixed[0]:
        return fixed[0], fixed[0]
    return down, up


def offending_prices(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows that break a promise, with the promise named (for the operator's table)."""
    broken = []
    for low, high in PROMISE_RULES:
        if low in frame.columns:
            name = low.removesuffix("_low")
            bad = frame.filter(~pl.col("price").is_between(pl.col(low), pl.col(high)))
            broken.append(
                bad.select(
                    "resource",
                    "price",
                    "previous",
                    pl.lit(name).alias("promise"),
                    pl.col(low).alias("low"),
                    pl.col(high).alias("high"),
                )
            )
    return pl.concat(broken) if broken else pl.DataFrame()
