"""Price quotes: expected cost of N GPUs for H hours with a 90% band.

Expected cost: the price in force at the start (the current equilibrium from the price
book, or the configured base price before the first solve) rated hour by hour with the
time coefficients of the hours the job would run, the zone coefficient, the class price
and the tenant's commitment tier. The band comes from the price book's own history: the
5% and 95% quantiles of (average price over the next H hours / price at the start) over
every past start point. With fewer than MIN_BAND_SAMPLES such windows, the band is the
range the price may reach within the price bounds and the max price step per tick.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import polars as pl

from market_pipeline.billing.errors import QuoteError
from market_pipeline.billing.pricing import (
    PriceHistory,
    load_price_history,
    month_to_date_gpu_hours,
    unit_price,
)
from market_pipeline.billing.rate_card import RateCard
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.tick.promises import Promises
from market_pipeline.warehouse import Warehouse

MIN_BAND_SAMPLES = 20
MAX_QUOTE_HOURS = 24 * 31
QUOTE_YEARS = (2000, 2100)  # a start outside is a typo (9999-12-31 overflowed the hour slices)
CENT = Decimal("0.01")


@dataclass(frozen=True)
class Quote:
    tenant_id: str
    pool_id: str
    resource_class: str
    gpus: float
    hours: float
    start: str
    currency: str
    expected_cost: Decimal
    low_90: Decimal
    high_90: Decimal
    unit_price_now: Decimal
    band_method: str
    band_samples: int
    components: dict[str, Decimal] = field(default_factory=dict)

    def as_json(self) -> dict:
        out = asdict(self)
        for key, value in list(out.items()):
            if isinstance(value, Decimal):
                out[key] = float(value)
        out["components"] = {k: float(v) for k, v in self.components.items()}
        return out


def _band_empirical(history: PriceHistory, resource_class: str, hours: float) -> tuple[float, float, int]:
    """5%/95% quantiles of window-average price / start price over the book's history."""
    series = history.series(resource_class if not history.series(resource_class).is_empty() else "guaranteed")
    if series.height < 2:
        return 1.0, 1.0, 0
    times = series["effective_from"].dt.epoch("s").to_numpy().astype(float)
    prices = series["price_per_gpu_hour"].cast(pl.Float64).to_numpy()
    horizon = hours * 3600.0
    ratios = []
    for i, start in enumerate(times):
        end = start + horizon
        if end > times[-1]:
            break
        grid = np.linspace(start, end, num=max(2, min(200, int(hours * 12) + 1)))
        idx = np.searchsorted(times, grid, side="right") - 1
        ratios.append(float(prices[idx].mean() / prices[i]))
    if len(ratios) < MIN_BAND_SAMPLES:
        return 1.0, 1.0, len(ratios)
    low, high = np.quantile(ratios, [0.05, 0.95])
    return float(min(low, 1.0)), float(max(high, 1.0)), len(ratios)


def _band_bounds(
    config: MarketPipelineConfig, pool_id: str, price_now: Decimal, hours: float
) -> tuple[float, float]:
    """The reachable price range: at most the promised max step per tick, inside the pool's bounds."""
    pool = config.pool_by_id[pool_id]
    ticks = max(1.0, hours * 60 / config.loop.tick_minutes)
    down, up = Promises.from_config(config).reach(ticks / 2)  # average over the window
    now = float(price_now)
    low = max(pool.price_min / now, down)
    high = min(pool.price_max / now, up)
    return min(low, 1.0), max(high, 1.0)


def _money(value: Decimal) -> Decimal:
    return value.quantize(CENT, rounding=ROUND_HALF_UP)


def quote(
    config: MarketPipelineConfig,
    warehouse: Warehouse | None,
    tenant_id: str,
    pool_id: str,
    gpus: float,
    hours: float,
    resource_class: str | None = None,
    start: dt.datetime | None = None,
) -> Quote:
    tenant = next((t for t in config.tenants if t.id == tenant_id), None)
    if tenant is None:
        raise QuoteError(f"unknown tenant {tenant_id!r}; known: {[t.id for t in config.tenants]}")
    if pool_id not in config.pool_by_id:
        raise QuoteError(f"unknown pool {pool_id!r}; known: {sorted(config.pool_by_id)}")
    pool = config.pool_by_id[pool_id]
    most = pool.max_nodes * pool.gpus_per_node  # no job runs on more GPUs than the pool can hold
    if not 0 < gpus <= most:
        raise QuoteError(f"--gpus must be in (0, {most}] (pool {pool_id} at max_nodes), got {gpus}")
    if not 0 < hours <= MAX_QUOTE_HOURS:
        raise QuoteError(f"--hours must be in (0, {MAX_QUOTE_HOURS}], got {hours}")
    if start is not None and not QUOTE_YEARS[0] <= start.astimezone(dt.timezone.utc).year <= QUOTE_YEARS[1]:
        raise QuoteError(
            f"--start {start.isoformat()} is outside the years {QUOTE_YEARS[0]}..{QUOTE_YEARS[1]}"
        )
    resource_class = resource_class or "guaranteed"
    if resource_class == "drainable" and not tenant.drain_tolerant:
        raise QuoteError(f"tenant {tenant_id!r} is not drain tolerant: it cannot buy the drainable class")
    start = (start or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    card = RateCard.from_config(config)
    history = load_price_history(warehouse, pool_id)
    mtd = month_to_date_gpu_hours(warehouse, tenant_id, start)
    now_price = unit_price(config, card, history, resource_class, start, mtd)
    totals = {
        "base": Decimal(0),
        "time_premium": Decimal(0),
        "location_premium": Decimal(0),
        "drainability_discount": Decimal(0),
        "commitment_discount": Decimal(0),
    }
    gpu_dec = Decimal(repr(float(gpus)))
    for hour_start, fraction in _hour_slices(start, hours):
        p = unit_price(config, card, history, resource_class, hour_start, mtd)
        # the price in force at the start holds (the equilibrium); the hour sets the band
        p = replace(p, list_price=now_price.list_price, class_price=now_price.class_price)
        qty = gpu_dec * fraction
        base = p.list_price * qty
        timed = base * p.time_coefficient
        listed = timed * p.location_coefficient
        contracted = p.class_price * qty * p.time_coefficient * p.location_coefficient
        billed = contracted * (1 - p.commitment_discount)
        totals["base"] += base
        totals["time_premium"] += timed - base
        totals["location_premium"] += listed - timed
        totals["drainability_discount"] += contracted - listed
        totals["commitment_discount"] += billed - contracted
    expected = sum(totals.values(), Decimal(0))
    low, high, samples = _band_empirical(history, resource_class, hours)
    method = "empirical_90"
    if samples < MIN_BAND_SAMPLES:
        low, high = _band_bounds(config, pool_id, now_price.list_price, hours)
        method = "price_bounds"
    return Quote(
        tenant_id=tenant_id,
        pool_id=pool_id,
        resource_class=resource_class,
        gpus=gpus,
        hours=hours,
        start=start.isoformat(),
        currency=config.billing.currency,
        expected_cost=_money(expected),
        low_90=_money(expected * Decimal(repr(low))),
        high_90=_money(expected * Decimal(repr(high))),
        unit_price_now=_money(now_price.effective_unit_price),
        band_method=method,
        band_samples=samples,
        components={k: _money(v) for k, v in totals.items()},
    )


def _hour_slices(start: dt.datetime, hours: float) -> list[tuple[dt.datetime, Decimal]]:
    """(moment, GPU-hours fraction) per clock hour the job touches, fractions summing to hours."""
    end = start + dt.timedelta(seconds=hours * 3600)
    slices = []
    cursor = start
    while cursor < end:
        boundary = cursor.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
        stop = min(boundary, end)
        seconds = Decimal(repr((stop - cursor).total_seconds()))
        slices.append((cursor, seconds / Decimal(3600)))
        cursor = stop
    if not slices or math.isclose(float(sum(f for _, f in slices)), 0.0):
        raise QuoteError(f"quote window of {hours} h is empty")
    return slices
