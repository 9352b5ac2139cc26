"""Unit prices outside dbt: the rate card and price book as read by quotes and budget guards.

The same rules as the dbt rating (list price from the price book or the configured base
price, time band by ISO weekday and UTC hour, zone coefficient, drainable class price or
the default drainable discount, month-to-date commitment tier), for one pool and moment.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import duckdb
import polars as pl

from market_pipeline.billing.errors import BillingError
from market_pipeline.billing.rate_card import RateCard
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.warehouse import Warehouse, WarehouseError, billing_readers

NANO = Decimal("0.000000001")
CLASSES = ("guaranteed", "drainable")


def to_money(value: Decimal) -> Decimal:
    return value.quantize(NANO, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class UnitPrice:
    """One GPU-hour of a pool and class at a moment, with its components."""

    pool_id: str
    resource_class: str
    at: dt.datetime
    list_price: Decimal  # guaranteed price per GPU-hour (price book or config base)
    class_price: Decimal  # the class's price per GPU-hour
    time_band: str
    time_coefficient: Decimal
    location_coefficient: Decimal
    commitment_discount: Decimal
    price_source: str

    @property
    def effective_unit_price(self) -> Decimal:
        return to_money(
            self.class_price
            * self.time_coefficient
            * self.location_coefficient
            * (1 - self.commitment_discount)
        )


@dataclass(frozen=True)
class PriceHistory:
    """Published prices of one pool, ordered by effective time (UTC)."""

    pool_id: str
    frame: pl.DataFrame  # effective_from, resource_class, price_per_gpu_hour

    def latest(self, resource_class: str, at: dt.datetime) -> Decimal | None:
        rows = self.frame.filter(
            (pl.col("resource_class") == resource_class) & (pl.col("effective_from") <= at)
        )
        if rows.is_empty():
            return None
        return rows.sort("effective_from")["price_per_gpu_hour"][-1]

    def series(self, resource_class: str) -> pl.DataFrame:
        return self.frame.filter(pl.col("resource_class") == resource_class).sort("effective_from")


def _table_missing(exc: WarehouseError) -> bool:
    """A warehouse not yet rolled up (no price book, no invoice lines): an empty history. Any
    other failure (a file that is not a warehouse, a lock) is the caller's error to report."""
    return isinstance(exc.__cause__, duckdb.CatalogException)


def load_price_history(warehouse: Warehouse | None, pool_id: str) -> PriceHistory:
    empty = pl.DataFrame(
        schema={
            "effective_from": pl.Datetime("us", "UTC"),
            "resource_class": pl.Utf8,
            "price_per_gpu_hour": pl.Decimal(18, 6),
        }
    )
    if warehouse is None or not warehouse.exists():
        return PriceHistory(pool_id, empty)
    try:
        frame = billing_readers.price_history(warehouse, pool_id)
    except WarehouseError as exc:
        if not _table_missing(exc):  # a file that is no warehouse: never quote from the bounds
            raise
        return PriceHistory(pool_id, empty)
    return PriceHistory(pool_id, frame.with_columns(pl.col("effective_from").dt.convert_time_zone("UTC")))


def month_to_date_gpu_hours(warehouse: Warehouse | None, tenant_id: str, at: dt.datetime) -> Decimal:
    """The tenant's billed GPU-hours this UTC month before `at` (0 when not rated yet)."""
    if warehouse is None or not warehouse.exists():
        return Decimal(0)
    month = at.astimezone(dt.timezone.utc).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    try:
        frame = billing_readers.billed_gpu_hours(warehouse, tenant_id, month, at)
    except WarehouseError as exc:
        if not _table_missing(exc):
            raise
        return Decimal(0)
    return Decimal(frame["h"][0])


def commitment_discount(card: RateCard, gpu_hours: Decimal) -> Decimal:
    discount = Decimal(0)
    for tier_hours, tier_discount in card.tiers.sort("min_gpu_hours").iter_rows():
        if gpu_hours >= tier_hours:
            discount = tier_discount
    return discount


def unit_price(
    config: MarketPipelineConfig,
    card: RateCard,
    history: PriceHistory,
    resource_class: str,
    at: dt.datetime,
    gpu_hours_mtd: Decimal = Decimal(0),
) -> UnitPrice:
    """The price of one GPU-hour of `history.pool_id` in `resource_class` at `at`."""
    pool = config.pool_by_id.get(history.pool_id)
    if pool is None:
        raise BillingError(f"unknown pool {history.pool_id!r}; known: {sorted(config.pool_by_id)}")
    if resource_class not in CLASSES:
        raise BillingError(f"resource class must be one of {CLASSES}, got {resource_class!r}")
    at = at.astimezone(dt.timezone.utc)
    booked = history.latest("guaranteed", at)
    list_price = booked if booked is not None else Decimal(repr(pool.base_price))
    source = "price_book" if booked is not None else "config_base_price"
    class_price = list_price
    if resource_class == "drainable":
        drainable = history.latest("drainable", at)
        default = card.terms["drainable_default_discount"][0]
        class_price = (
            drainable
            if drainable is not None
            else (list_price * (1 - default)).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
        )
    band_row = card.time.filter(
        (pl.col("day_of_week") == at.isoweekday()) & (pl.col("hour_of_day") == at.hour)
    )
    zone_row = card.zones.filter(pl.col("zone") == pool.zone)
    if band_row.is_empty() or zone_row.is_empty():
        raise BillingError(f"rate card lacks time band for {at.isoformat()} or zone {pool.zone!r}")
    return UnitPrice(
        pool_id=history.pool_id,
        resource_class=resource_class,
        at=at,
        list_price=list_price,
        class_price=class_price,
        time_band=band_row["band"][0],
        time_coefficient=band_row["coefficient"][0],
        location_coefficient=zone_row["location_coefficient"][0],
        commitment_discount=commitment_discount(card, gpu_hours_mtd),
        price_source=source,
    )
