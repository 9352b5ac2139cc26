"""The API's request and response bodies (pydantic: they make the OpenAPI schema).
Request bodies forbid unknown fields, so a body that names a tenant is refused (422)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from market_pipeline.hardware.protocol import ResourceClass as TaskResourceClass

# A task's resource class as the API's text: the values of the one enum the drains and the
# fleet use, so a class added there is accepted here.
ResourceClass = Literal[tuple(c.value for c in TaskResourceClass)]  # type: ignore[valid-type]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Price(BaseModel):
    pool_id: str
    resource_class: str
    price_per_gpu_hour: float
    effective_from: datetime
    source: str | None = None
    reason: str | None = Field(None, description="why the published price differs from the solver's")


class Prices(BaseModel):
    currency: str
    prices: list[Price]


class PricePoint(BaseModel):
    effective_from: datetime
    pool_id: str
    resource_class: str
    price: float
    source: str | None = None
    reason: str | None = None


class PriceHistory(BaseModel):
    pool_id: str | None
    resource_class: str | None
    points: list[PricePoint]


class QuoteOut(BaseModel):
    tenant_id: str
    pool_id: str
    resource_class: str
    gpus: float
    hours: float
    start: str
    currency: str
    expected_cost: float
    low_90: float
    high_90: float
    unit_price_now: float
    band_method: str
    band_samples: int
    components: dict[str, float]


class Rows(BaseModel):
    """A list of rows (column name -> value) with the columns they carry."""

    tenant_id: str | None = None
    columns: list[str]
    rows: list[dict]


class BalanceOut(BaseModel):
    """Money as decimal strings (exact), e.g. "-184.057281539"."""

    tenant_id: str
    currency: str
    balance: str
    spent_today: str
    spent_month: str
    guarded: bool
    prepaid: bool | None = None
    credit_limit: str | None = None
    hard_cap_daily: str | None = None
    hard_cap_monthly: str | None = None


class HardCapIn(_Body):
    """Set (a number) or remove (null) the daily and monthly caps; an omitted one stays."""

    hard_cap_daily: Decimal | None = Field(None, ge=0, le=Decimal("99999999999"), decimal_places=9)
    hard_cap_monthly: Decimal | None = Field(None, ge=0, le=Decimal("99999999999"), decimal_places=9)


class WebhookIn(_Body):
    url: HttpUrl = Field(description="http(s) URL that receives drain warnings (POST, JSON, signed)")


class WebhookOut(BaseModel):
    webhook_id: str
    url: str
    created_at: str
    secret: str | None = Field(None, description="HMAC-SHA256 signing secret, shown only at registration")


class Me(BaseModel):
    tenant_id: str
    key_id: str
