"""The console: server-rendered HTML pages with inline SVG charts (svg.py).

Server-side SVG rather than a JavaScript chart library: nothing to vendor or fetch (no CDN
is reachable from the fleet's network), no script to keep patched, pages that render with
scripts off, and the numbers are in the markup the tests read. Tenant pages: prices and
their history, the demand heat map, my costs by component, my notices and drains. Operator
pages (operator key): per-pool prices with each change's reason, utilisation per pool, the
drain and scaling timeline with outcomes, a per-tenant view and decision search.

Login keeps the key in an HttpOnly, SameSite=Strict cookie; every page checks it like the
API does (401 -> back to the login page, a tenant key on an operator page -> 403).
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

import polars as pl
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from market_pipeline.billing.tenant_scope import tenant_query
from market_pipeline.service import svg
from market_pipeline.service.auth import COOKIE, context_of, operator, tenant
from market_pipeline.service.keystore import ROLE_OPERATOR, Principal
from market_pipeline.warehouse import WarehouseError
from market_pipeline.warehouse import service_readers as readers
from market_pipeline.warehouse.drain_outbox import tenant_drain_warnings

router = APIRouter(prefix="/console", include_in_schema=False)
TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)
WINDOW = dt.timedelta(days=7)
COST_COMPONENTS = [c for c in readers.COST_COMPONENTS]
TENANT_NAV = [("/console/me", "my market")]
OPERATOR_NAV = [("/console/operator", "operator"), ("/console/operator/search", "search decisions")]


def _page(template: str, **values: object) -> HTMLResponse:
    return HTMLResponse(TEMPLATES.get_template(template).render(**values))


def _guard(request: Request, check) -> Principal | Response:  # noqa: ANN001 - an auth dependency
    try:
        return check(request)
    except HTTPException as exc:
        if exc.status_code == 401:
            return RedirectResponse("/console", status_code=303)
        raise


def _window_start(frame: pl.DataFrame, column: str) -> dt.datetime | None:
    if frame.is_empty():
        return None
    return frame[column].max() - WINDOW


@router.get("", response_class=HTMLResponse)
def login_page(request: Request) -> Response:
    return _page("login.html", title="Log in", nav=[], who=None, error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    form = urllib.parse.parse_qs((await request.body())[:4096].decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0].strip()
    found = context_of(request).store.authenticate(key) if key else None
    if found is None:
        page = _page("login.html", title="Log in", nav=[], who=None, error="unknown or revoked key")
        page.status_code = 401
        return page
    target = "/console/operator" if found.role == ROLE_OPERATOR else "/console/me"
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE, key, httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/"
    )
    return response


@router.get("/logout")
def logout() -> Response:
    response = RedirectResponse("/console", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# -- tenant pages ----------------------------------------------------------------------------


def _price_chart(request: Request, chart_id: str) -> tuple[pl.DataFrame, object]:
    wh = context_of(request).warehouse
    now = readers.prices_now(wh)
    series_frame = readers.price_series(wh, None, None, _window_start(now, "effective_from"))
    series: dict[str, list[tuple[dt.datetime, float]]] = {}
    for row in series_frame.iter_rows(named=True):
        series.setdefault(f"{row['pool_id']}/{row['resource_class']}", []).append(
            (row["effective_from"], row["price"])
        )
    return now, svg.line_chart(chart_id, series, "price / GPU-hour", step=True)


def _heat(request: Request) -> object:
    wh = context_of(request).warehouse
    last = readers.pool_snapshots(wh, None, limit=1)
    frame = readers.demand_heat(wh, _window_start(last, "ts"))
    pools = sorted(set(frame["pool_id"].to_list())) if frame.height else []
    hours = sorted(set(frame["hour"].to_list())) if frame.height else []
    values = {(r["pool_id"], r["hour"]): r["demand"] for r in frame.iter_rows(named=True)}
    return svg.heat_map("demand-heat", pools, hours, values)


def _tenant_page(request: Request, tenant_id: str, who: str, nav: Sequence[tuple[str, str]]) -> HTMLResponse:
    ctx = context_of(request)
    prices, price_chart = _price_chart(request, "price-history")
    try:
        costs = readers.tenant_daily_cost(
            lambda sql, params: tenant_query(ctx.warehouse, tenant_id, sql, params)
        )
    except Exception:  # not rated yet (no billing marts): the page still shows prices  # noqa: BLE001
        costs = pl.DataFrame()
    labels = [str(d) for d in costs["day"].to_list()] if costs.height else []
    components = {c: costs[c].to_list() for c in COST_COMPONENTS} if costs.height else {}
    try:
        notices = [w.payload() for w in tenant_drain_warnings(ctx.warehouse, tenant_id)]
    except WarehouseError:
        notices = []
    return _page(
        "tenant.html",
        title=f"Market for {tenant_id}",
        who=who,
        nav=nav,
        prices_now=prices.to_dicts(),
        price_chart=price_chart,
        heat=_heat(request),
        costs_title="My costs" if who == tenant_id else f"Costs of {tenant_id}",
        notices_title="My notices" if who == tenant_id else f"Notices of {tenant_id}",
        cost_chart=svg.stacked_bars("cost-breakdown", labels, components, ctx.config.billing.currency),
        components=COST_COMPONENTS,
        costs=costs.to_dicts(),
        currency=ctx.config.billing.currency,
        notices=notices,
        drains=readers.tenant_drains(ctx.warehouse, tenant_id, 200).to_dicts(),
    )


@router.get("/me", response_class=HTMLResponse)
def my_page(request: Request) -> Response:
    who = _guard(request, tenant)
    if isinstance(who, Response):
        return who
    return _tenant_page(request, who.tenant_id, who.tenant_id, TENANT_NAV)


# -- operator pages --------------------------------------------------------------------------


def _changes(frame: pl.DataFrame) -> list[dict]:
    """Ticks where a published price moved or was not as solved."""
    out, last = [], {}
    for row in frame.iter_rows(named=True):
        moved = (row["guaranteed"], row["drainable"]) != last.get("prices")
        reasoned = row["guaranteed_reason"] != "as solved" or row["drainable_reason"] != "as solved"
        if moved or reasoned:
            out.append(row)
        last["prices"] = (row["guaranteed"], row["drainable"])
    return out


@router.get("/operator", response_class=HTMLResponse)
def operator_page(request: Request) -> Response:
    who = _guard(request, operator)
    if isinstance(who, Response):
        return who
    ctx = context_of(request)
    pools = []
    for pool in sorted(ctx.config.pool_by_id):
        ticks = readers.tick_reasons(ctx.warehouse, pool, limit=24 * 7)
        series = {
            name: [(r["tick_at"], r[column]) for r in ticks.iter_rows(named=True)]
            for name, column in (
                ("guaranteed", "guaranteed"),
                ("drainable", "drainable"),
                ("solver guaranteed", "solver_guaranteed"),
                ("solver drainable", "solver_drainable"),
            )
        }
        chart_id = "prices-" + "".join(ch if ch.isalnum() else "-" for ch in pool)
        pools.append(
            {
                "pool_id": pool,
                "chart": svg.line_chart(chart_id, series, "price / GPU-hour", step=True),
                "changes": _changes(ticks),
            }
        )
    last = readers.pool_snapshots(ctx.warehouse, None, limit=1)
    snaps = readers.pool_snapshots(ctx.warehouse, _window_start(last, "ts"))
    util: dict[str, list[tuple[dt.datetime, float]]] = {}
    for row in snaps.iter_rows(named=True):
        util.setdefault(row["pool_id"], []).append((row["ts"], row["utilisation"]))
    return _page(
        "operator.html",
        title="Operator",
        who="operator",
        nav=OPERATOR_NAV,
        pools=pools,
        utilisation=svg.line_chart("utilisation", util, "running / powered GPUs"),
        timeline=readers.decision_timeline(ctx.warehouse, ("drain", "scale", "budget_guard"), 300).to_dicts(),
        tenants=ctx.tenant_ids,
    )


@router.get("/operator/tenants/{tenant_id}", response_class=HTMLResponse)
def tenant_view(request: Request, tenant_id: str) -> Response:
    who = _guard(request, operator)
    if isinstance(who, Response):
        return who
    if tenant_id not in context_of(request).tenant_ids:
        raise HTTPException(status_code=404, detail="no such tenant")
    return _tenant_page(request, tenant_id, "operator", OPERATOR_NAV)


@router.get("/operator/search", response_class=HTMLResponse)
def search(
    request: Request, node: str | None = None, tenant: str | None = None, pool: str | None = None
) -> Response:
    who = _guard(request, operator)
    if isinstance(who, Response):
        return who
    node, tenant, pool = (v.strip() or None if v else None for v in (node, tenant, pool))
    results = (
        readers.search_decisions(context_of(request).warehouse, node, tenant, pool).to_dicts()
        if (node or tenant or pool)
        else []
    )
    return _page(
        "search.html",
        title="Search decisions",
        who="operator",
        nav=OPERATOR_NAV,
        node=node,
        tenant=tenant,
        pool=pool,
        results=results,
    )
