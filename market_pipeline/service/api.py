"""The tenant API under /v1 (and the operator's JSON under /v1/operator).

Every tenant endpoint acts for the tenant of the presented key only. A resource of another
tenant (a drain decision, a webhook) answers 404 as if it did not exist. Billing rows come
from the dbt marts through the tenant scoping of `tenant-sql` (billing.tenant_scope): a
private database holding only this tenant's rows. Quotes call the same function as the
`quote` command (billing.quotes.quote).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Literal

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from market_pipeline.billing.balances import Account, accounts, set_account, tenant_spend
from market_pipeline.billing.errors import BillingError, QuoteError
from market_pipeline.billing.quotes import MAX_QUOTE_HOURS, quote
from market_pipeline.billing.tenant_scope import tenant_query
from market_pipeline.service import schemas
from market_pipeline.service.auth import context_of, operator, tenant
from market_pipeline.service.gate import GatedWarehouse
from market_pipeline.service.keystore import Principal
from market_pipeline.warehouse import service_readers as readers
from market_pipeline.warehouse.drain_outbox import tenant_drain_warnings

router = APIRouter(prefix="/v1")
Tenant = Annotated[Principal, Depends(tenant)]
Operator = Annotated[Principal, Depends(operator)]
Since = Annotated[dt.datetime | None, Query(description="ISO 8601 time; rows from then on")]
Limit = Annotated[int, Query(ge=1, le=readers.MAX_ROWS)]
IdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@/+-]+$")]


def field_error(field: str, message: str, where: str = "query") -> HTTPException:
    """A 422 naming the field, shaped like FastAPI's own validation errors."""
    return HTTPException(
        status_code=422, detail=[{"loc": [where, field], "msg": message, "type": "value_error"}]
    )


def rows(frame: pl.DataFrame, tenant_id: str | None = None) -> schemas.Rows:
    def clean(value: object) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    return schemas.Rows(
        tenant_id=tenant_id,
        columns=list(frame.columns),
        rows=[{k: clean(v) for k, v in r.items()} for r in frame.to_dicts()],
    )


def _pool(request: Request, pool: str | None, name: str = "pool") -> str | None:
    known = context_of(request).config.pool_by_id
    if pool is not None and pool not in known:
        raise field_error(name, f"unknown pool; known: {sorted(known)}")
    return pool


def _run_scoped(request: Request, tenant_id: str):  # noqa: ANN202 - a readers.TenantRunner
    warehouse = context_of(request).warehouse

    def run(sql: str, params: list[object]) -> pl.DataFrame:
        return tenant_query(warehouse, tenant_id, sql, params)

    return run


# -- prices ----------------------------------------------------------------------------------


def _json(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


async def _memoised_json(
    warehouse: GatedWarehouse, key: tuple[object, ...], build: Callable[[], bytes]
) -> Response:
    """The JSON body `build` makes, from the cache on the event loop where it holds it (the
    common case: the warehouse changes once a tick), else computed on a worker thread (a
    warehouse read must never hold up the loop)."""
    hit = warehouse.cached(key)
    body = hit[0] if hit is not None else await run_in_threadpool(warehouse.memo, key, build)
    return Response(body, media_type="application/json")


@router.get("/prices", response_model=schemas.Prices, tags=["prices"])
async def prices_now(request: Request, who: Tenant) -> Response:
    """The price in force per pool and class, with the reason where it is not the solver's."""
    ctx = context_of(request)

    def build() -> bytes:
        frame = readers.prices_now(ctx.warehouse)
        return _json(
            schemas.Prices(
                currency=ctx.config.billing.currency,
                prices=[
                    schemas.Price(
                        price_per_gpu_hour=r["price"],
                        **{k: r[k] for k in schemas.Price.model_fields if k in r},
                    )
                    for r in frame.to_dicts()
                ],
            )
        )

    return await _memoised_json(ctx.warehouse, ("prices_now",), build)


@router.get("/prices/history", response_model=schemas.PriceHistory, tags=["prices"])
def price_history(
    request: Request,
    who: Tenant,
    pool: str | None = None,
    resource_class: schemas.ResourceClass | None = None,
    since: Since = None,
    limit: Limit = 1000,
) -> schemas.PriceHistory:
    """Published prices over time, oldest first (the newest `limit`)."""
    pool = _pool(request, pool)
    frame = readers.price_series(context_of(request).warehouse, pool, resource_class, since, limit)
    return schemas.PriceHistory(
        pool_id=pool,
        resource_class=resource_class,
        points=[schemas.PricePoint(**r) for r in frame.to_dicts()],
    )


@router.get("/quote", response_model=schemas.QuoteOut, tags=["prices"])
async def get_quote(
    request: Request,
    who: Tenant,
    pool: str,
    gpus: Annotated[float, Query(gt=0, allow_inf_nan=False)],
    hours: Annotated[float, Query(gt=0, le=MAX_QUOTE_HOURS, allow_inf_nan=False)],
    resource_class: schemas.ResourceClass = "guaranteed",
    start: Annotated[dt.datetime | None, Query(description="ISO start (default: the current minute)")] = None,
) -> Response:
    """Expected cost of `gpus` GPUs for `hours` with a 90% band: the `quote` command's numbers."""
    ctx = context_of(request)
    _pool(request, pool)
    if start is not None and start.tzinfo is None:
        start = start.replace(tzinfo=dt.timezone.utc)
    # "now" is the current minute: every quote of the same job in that minute is one result,
    # reused while the warehouse is unchanged (the quote reads only the warehouse and these)
    when = start or dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)

    def build() -> bytes:
        return _json(
            schemas.QuoteOut(
                **quote(
                    ctx.config, ctx.warehouse, who.tenant_id, pool, gpus, hours, resource_class, when
                ).as_json()
            )
        )

    try:
        return await _memoised_json(
            ctx.warehouse,
            ("quote", who.tenant_id, pool, gpus, hours, resource_class, when.isoformat()),
            build,
        )
    except QuoteError as exc:
        text = str(exc)
        field = next(
            (f for f in ("gpus", "hours", "start") if text.startswith(f"--{f}")),
            "resource_class" if "drain tolerant" in text else "pool",
        )
        raise field_error(field, text.replace(f"--{field}", field)) from None


# -- my usage, invoices, drains, notices, balance -----------------------------------------------


@router.get("/me", response_model=schemas.Me, tags=["me"])
def me(who: Tenant) -> schemas.Me:
    return schemas.Me(tenant_id=who.tenant_id, key_id=who.key_id)


@router.get("/me/usage", response_model=schemas.Rows, tags=["me"])
def my_usage(
    request: Request,
    who: Tenant,
    grain: Literal["hour", "day"] = "hour",
    since: Since = None,
    limit: Limit = 500,
) -> schemas.Rows:
    """My invoice lines with the cost broken down: base, time and location premiums,
    drainability and commitment discounts, SLA credit (the billing marts, not re-rated)."""
    frame = readers.tenant_invoice_lines(_run_scoped(request, who.tenant_id), grain, since, limit)
    return rows(frame, who.tenant_id)


@router.get("/me/invoices", response_model=schemas.Rows, tags=["me"])
def my_invoices(request: Request, who: Tenant) -> schemas.Rows:
    return rows(readers.tenant_invoices(_run_scoped(request, who.tenant_id)), who.tenant_id)


@router.get("/me/costs/daily", response_model=schemas.Rows, tags=["me"])
def my_daily_costs(request: Request, who: Tenant) -> schemas.Rows:
    return rows(readers.tenant_daily_cost(_run_scoped(request, who.tenant_id)), who.tenant_id)


@router.get("/me/drains", response_model=schemas.Rows, tags=["me"])
def my_drains(request: Request, who: Tenant, limit: Limit = 500) -> schemas.Rows:
    return rows(readers.tenant_drains(context_of(request).warehouse, who.tenant_id, limit), who.tenant_id)


@router.get("/me/drains/{decision_id}", response_model=schemas.Rows, tags=["me"])
def my_drain(request: Request, who: Tenant, decision_id: IdPath) -> schemas.Rows:
    frame = readers.tenant_drains(context_of(request).warehouse, who.tenant_id)
    frame = frame.filter(pl.col("decision_id") == decision_id)
    if frame.is_empty():
        raise HTTPException(status_code=404, detail="no such drain")
    return rows(frame, who.tenant_id)


@router.get("/me/notices", response_model=schemas.Rows, tags=["me"])
def my_notices(request: Request, who: Tenant) -> schemas.Rows:
    """My drain warnings (expected drain time, reasons, notice, how to get a longer one)."""
    ctx = context_of(request)
    notices = [w.payload() for w in tenant_drain_warnings(ctx.warehouse, who.tenant_id)]
    delivered = {d["notice_id"] for d in ctx.store.deliveries(who.tenant_id) if d["state"] == "delivered"}
    for notice in notices:
        notice["webhook_delivered"] = notice["notice_id"] in delivered
    columns = list(notices[0]) if notices else ["notice_id"]
    return schemas.Rows(tenant_id=who.tenant_id, columns=columns, rows=notices)


def _balance(request: Request, tenant_id: str) -> schemas.BalanceOut:
    ctx = context_of(request)
    spend = tenant_spend(ctx.warehouse, dt.datetime.now(dt.timezone.utc)).get(tenant_id)
    account = next((a for a in accounts(ctx.warehouse) if a.tenant_id == tenant_id), None)
    zero = Decimal(0)

    def money(value: Decimal | None) -> str | None:
        return None if value is None else format(value.normalize(), "f")

    return schemas.BalanceOut(
        tenant_id=tenant_id,
        currency=ctx.config.billing.currency,
        balance=money(spend.balance if spend else zero),
        spent_today=money(spend.spent_today if spend else zero),
        spent_month=money(spend.spent_month if spend else zero),
        guarded=account is not None,
        prepaid=account.prepaid if account else None,
        credit_limit=money(account.credit_limit) if account else None,
        hard_cap_daily=money(account.hard_cap_daily) if account else None,
        hard_cap_monthly=money(account.hard_cap_monthly) if account else None,
    )


@router.get("/me/balance", response_model=schemas.BalanceOut, tags=["me"])
def my_balance(request: Request, who: Tenant) -> schemas.BalanceOut:
    return _balance(request, who.tenant_id)


@router.put("/me/hard-cap", response_model=schemas.BalanceOut, tags=["me"])
def set_hard_cap(request: Request, who: Tenant, body: schemas.HardCapIn) -> schemas.BalanceOut:
    """Set my budget guard's hard caps (the billing job enforces them). The one write the
    service makes to the warehouse: one short transaction on `billing_accounts`."""
    ctx = context_of(request)
    current = next(
        (a for a in accounts(ctx.warehouse) if a.tenant_id == who.tenant_id),
        Account(who.tenant_id, prepaid=False),
    )
    sent = body.model_fields_set
    account = Account(
        who.tenant_id,
        prepaid=current.prepaid,
        credit_limit=current.credit_limit,
        hard_cap_daily=body.hard_cap_daily if "hard_cap_daily" in sent else current.hard_cap_daily,
        hard_cap_monthly=body.hard_cap_monthly if "hard_cap_monthly" in sent else current.hard_cap_monthly,
    )
    try:
        set_account(ctx.warehouse, account)
    except BillingError as exc:
        raise field_error("hard_cap_daily", str(exc), "body") from None
    return _balance(request, who.tenant_id)


# -- webhooks --------------------------------------------------------------------------------


@router.post("/me/webhooks", response_model=schemas.WebhookOut, status_code=201, tags=["webhooks"])
def register_webhook(request: Request, who: Tenant, body: schemas.WebhookIn) -> schemas.WebhookOut:
    """Register a URL for my drain warnings; the signing secret is in this answer only."""
    url = str(body.url)
    if body.url.scheme not in ("http", "https"):
        raise field_error("url", "url must be http or https", "body")
    if body.url.username or body.url.password:
        raise field_error("url", "url must not carry credentials", "body")
    hook = context_of(request).store.register_webhook(who.tenant_id, url)
    return schemas.WebhookOut(
        webhook_id=hook.webhook_id, url=hook.url, created_at=hook.created_at, secret=hook.secret
    )


@router.get("/me/webhooks", response_model=list[schemas.WebhookOut], tags=["webhooks"])
def my_webhooks(request: Request, who: Tenant) -> list[schemas.WebhookOut]:
    return [
        schemas.WebhookOut(webhook_id=h.webhook_id, url=h.url, created_at=h.created_at)
        for h in context_of(request).store.webhooks(who.tenant_id)
    ]


@router.delete("/me/webhooks/{webhook_id}", status_code=204, tags=["webhooks"])
def remove_webhook(request: Request, who: Tenant, webhook_id: IdPath) -> Response:
    if not context_of(request).store.remove_webhook(who.tenant_id, webhook_id):
        raise HTTPException(status_code=404, detail="no such webhook")
    return Response(status_code=204)


@router.get("/me/webhooks/deliveries", response_model=schemas.Rows, tags=["webhooks"])
def my_deliveries(request: Request, who: Tenant) -> schemas.Rows:
    found = context_of(request).store.deliveries(who.tenant_id)
    columns = list(found[0]) if found else ["delivery_id"]
    return schemas.Rows(tenant_id=who.tenant_id, columns=columns, rows=found)


# -- operator --------------------------------------------------------------------------------


@router.get("/operator/decisions", response_model=schemas.Rows, tags=["operator"])
def search_decisions(
    request: Request,
    who: Operator,
    node: str | None = None,
    tenant_id: Annotated[str | None, Query(alias="tenant")] = None,
    pool: str | None = None,
    limit: Limit = 500,
) -> schemas.Rows:
    """Decisions by node (target or input), tenant or pool, newest first."""
    _pool(request, pool)
    return rows(readers.search_decisions(context_of(request).warehouse, node, tenant_id, pool, limit))


@router.get("/operator/ticks", response_model=schemas.Rows, tags=["operator"])
def ticks(request: Request, who: Operator, pool: str | None = None, limit: Limit = 500) -> schemas.Rows:
    """Each tick's published prices per pool with both classes' reasons."""
    _pool(request, pool)
    return rows(readers.tick_reasons(context_of(request).warehouse, pool, limit))
