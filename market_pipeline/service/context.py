"""What every request handler shares: the configuration, the gated warehouse, the key store
and the rate limiter (built once by `app.create_app`)."""

from __future__ import annotations

from dataclasses import dataclass

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.service.gate import GatedWarehouse
from market_pipeline.service.keystore import KeyStore
from market_pipeline.service.ratelimit import RateLimiter


@dataclass(frozen=True)
class ServiceContext:
    config: MarketPipelineConfig
    warehouse: GatedWarehouse
    store: KeyStore
    limiter: RateLimiter

    @classmethod
    def build(cls, config: MarketPipelineConfig, warehouse_path: str | None = None) -> "ServiceContext":
        from pathlib import Path

        path = Path(warehouse_path) if warehouse_path else config.warehouse_path
        settings = config.service
        return cls(
            config=config,
            warehouse=GatedWarehouse(
                path, lock_retry_seconds=settings.read_retry_seconds, lock_retry_max_delay=0.05
            ),
            store=KeyStore(config.resolve_path(settings.store_path)),
            limiter=RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst),
        )

    @property
    def tenant_ids(self) -> list[str]:
        return [t.id for t in self.config.tenants]
