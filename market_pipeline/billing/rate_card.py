"""The billing rate card: the typed config's billing terms as warehouse tables.

dbt rates usage from these tables (not from dbt vars) so that finance can read, with SQL,
exactly which coefficients, tiers and terms produced a bill. `refresh_rate_card` rewrites
all of them in one transaction from the config.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

import polars as pl

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.tick.promises import Promises
from market_pipeline.warehouse import Warehouse, billing_ledger

# An SLA credit covers the task's billed usage in this many seconds before the fault: the
# hour of work a platform-caused failure or drain failure typically destroys.
SLA_CREDIT_WINDOW_SECONDS = 3600
WEEKEND_ISO_DAYS = (6, 7)  # Saturday, Sunday (ISO day of week, UTC)

RATE_CARD_TABLES = (
    "billing_rate_card_time",
    "billing_rate_card_zones",
    "billing_rate_card_pools",
    "billing_commitment_tiers",
    "billing_terms",
    "billing_rate_card_gpu_costs",
)


def _dec(value: float, places: int = 6) -> Decimal:
    """A config float as the decimal its TOML text meant (1.15 -> Decimal('1.150000'))."""
    return Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-places))


def time_band(config: MarketPipelineConfig, iso_day: int, hour: int) -> str:
    if iso_day in WEEKEND_ISO_DAYS:
        return "weekend"
    return "peak" if hour in config.billing.peak_hours else "offpeak"


def time_coefficients(config: MarketPipelineConfig) -> pl.DataFrame:
    """168 rows: (ISO day of week, UTC hour) -> band and coefficient."""
    rows = []
    for day in range(1, 8):
        for hour in range(24):
            band = time_band(config, day, hour)
            rows.append((day, hour, band, _dec(config.billing.time_coefficients.get(band, 1.0))))
    return pl.DataFrame(
        rows,
        orient="row",
        schema={
            "day_of_week": pl.Int32,
            "hour_of_day": pl.Int32,
            "band": pl.Utf8,
            "coefficient": pl.Decimal(9, 6),
        },
    )


def zone_coefficients(config: MarketPipelineConfig) -> pl.DataFrame:
    return pl.DataFrame(
        [(z.name, _dec(z.location_coefficient)) for z in config.zones],
        orient="row",
        schema={"zone": pl.Utf8, "location_coefficient": pl.Decimal(9, 6)},
    )


def pool_prices(config: MarketPipelineConfig) -> pl.DataFrame:
    """Configured base prices: used where the price book has no price yet (marked in marts)."""
    rows = []
    for pool in config.pools:
        model = config.gpu_model_by_name[pool.gpu_model]
        rows.append(
            (
                pool.pool_id,
                pool.gpu_model,
                pool.zone,
                _dec(pool.base_price),
                _dec(pool.price_min),
                _dec(pool.price_max),
                model.memory_mib,
            )
        )
    return pl.DataFrame(
        rows,
        orient="row",
        schema={
            "pool_id": pl.Utf8,
            "gpu_model": pl.Utf8,
            "zone": pl.Utf8,
            "base_price_per_gpu_hour": pl.Decimal(18, 6),
            "price_min": pl.Decimal(18, 6),
            "price_max": pl.Decimal(18, 6),
            "gpu_memory_mib": pl.Int32,
        },
    )


def commitment_tiers(config: MarketPipelineConfig) -> pl.DataFrame:
    tiers = sorted(config.billing.commitment_tiers, key=lambda t: t.min_gpu_hours)
    rows = [(_dec(t.min_gpu_hours), _dec(t.discount)) for t in tiers]
    if not rows or rows[0][0] > 0:
        rows.insert(0, (_dec(0.0), _dec(0.0)))  # below the first tier: no discount
    return pl.DataFrame(
        rows, orient="row", schema={"min_gpu_hours": pl.Decimal(18, 6), "discount": pl.Decimal(9, 6)}
    )


def gpu_costs(config: MarketPipelineConfig) -> pl.DataFrame:
    """What a powered GPU-hour costs the platform, per GPU model (capacity cost)."""
    rows = [(name, _dec(model.cost_per_gpu_hour)) for name, model in sorted(config.gpu_model_by_name.items())]
    return pl.DataFrame(
        rows, orient="row", schema={"gpu_model": pl.Utf8, "cost_per_gpu_hour": pl.Decimal(18, 6)}
    )


def billing_terms(config: MarketPipelineConfig, now: dt.datetime | None = None) -> pl.DataFrame:
    now = now or dt.datetime.now(dt.timezone.utc)
    return pl.DataFrame(
        [
            {
                "currency": config.billing.currency,
                "grace_seconds": config.billing.grace_seconds,
                "sla_credit_rate": _dec(config.billing.sla_credit_rate),
                "sla_credit_window_seconds": SLA_CREDIT_WINDOW_SECONDS,
                "drainable_default_discount": _dec(Promises.from_config(config).discount_min),
                "refreshed_at": now,
            }
        ],
        schema={
            "currency": pl.Utf8,
            "grace_seconds": pl.Int32,
            "sla_credit_rate": pl.Decimal(9, 6),
            "sla_credit_window_seconds": pl.Int32,
            "drainable_default_discount": pl.Decimal(9, 6),
            "refreshed_at": pl.Datetime("us", "UTC"),
        },
    )


@dataclass(frozen=True)
class RateCard:
    time: pl.DataFrame
    zones: pl.DataFrame
    pools: pl.DataFrame
    tiers: pl.DataFrame
    terms: pl.DataFrame
    gpu_costs: pl.DataFrame

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "RateCard":
        return cls(
            time_coefficients(config),
            zone_coefficients(config),
            pool_prices(config),
            commitment_tiers(config),
            billing_terms(config),
            gpu_costs(config),
        )

    def tables(self) -> dict[str, pl.DataFrame]:
        return dict(
            zip(RATE_CARD_TABLES, (self.time, self.zones, self.pools, self.tiers, self.terms, self.gpu_costs))
        )


def refresh_rate_card(warehouse: Warehouse, config: MarketPipelineConfig) -> RateCard:
    """Rewrite every rate card table from the config in one transaction."""
    card = RateCard.from_config(config)
    billing_ledger.rewrite_rate_card(warehouse, card.tables())
    return card
