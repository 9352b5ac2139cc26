"""The FastAPI application: the /v1 API, the console, /metrics, and (optionally) the webhook
delivery worker as a thread of the server.

FastAPI (on Starlette, under uvicorn) because it derives the OpenAPI schema and the 422
answers naming the field from the same pydantic types the project already uses, and its
dependencies express "this endpoint needs a tenant key" once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse

from market_pipeline.billing.errors import BillingError
from market_pipeline.service import api, console, metrics
from market_pipeline.service.context import ServiceContext
from market_pipeline.service.gate import WarehouseBusy
from market_pipeline.service.webhooks import DeliveryWorker
from market_pipeline.warehouse import WarehouseError

log = logging.getLogger(__name__)

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; form-action 'self';"
        b" frame-ancestors 'none'",
    ),
]


class SecurityHeaders:
    """Plain ASGI middleware (cheaper than BaseHTTPMiddleware) adding the headers above."""

    def __init__(self, app) -> None:  # noqa: ANN001 - any ASGI app
        self.app = app

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message) -> None:  # noqa: ANN001
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in names
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


def _one_line(errors: list[dict]) -> str:
    parts = []
    for error in errors:
        loc = [str(x) for x in error.get("loc", ()) if x not in ("query", "body", "path", "header")]
        parts.append(f"{'.'.join(loc) or 'request'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app(context: ServiceContext, deliver_webhooks: bool = False) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if deliver_webhooks:
            worker = DeliveryWorker(context.warehouse, context.store, context.config.service)
            thread = threading.Thread(target=worker.run, args=(stop,), name="webhook-delivery", daemon=True)
            thread.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=10)

    app = FastAPI(
        title="market-pipeline",
        version="1",
        description="Prices, quotes, usage, drains and webhooks of the GPU market, per tenant.",
        lifespan=lifespan,
    )
    app.state.context = context
    app.include_router(api.router)
    app.include_router(console.router)
    app.include_router(metrics.router)
    if context.config.service.cors_origins:  # closed unless origins are configured
        app.add_middleware(
            CORSMiddleware,
            allow_origins=context.config.service.cors_origins,
            allow_methods=["GET", "PUT", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(SecurityHeaders)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {k: v for k, v in e.items() if k in ("loc", "msg", "type")}  # no echo of the input
            for e in exc.errors()
        ]
        return JSONResponse(status_code=422, content={"error": _one_line(errors), "detail": errors})

    @app.exception_handler(WarehouseBusy)
    async def busy(request: Request, exc: WarehouseBusy) -> JSONResponse:
        return JSONResponse(
            status_code=503, content={"detail": "the warehouse is busy; retry"}, headers={"Retry-After": "1"}
        )

    @app.exception_handler(WarehouseError)
    @app.exception_handler(BillingError)
    async def not_ready(request: Request, exc: Exception) -> JSONResponse:
        log.warning("warehouse read failed on %s: %s", request.url.path, " ".join(str(exc).split())[:300])
        return JSONResponse(
            status_code=503,
            content={"detail": "the warehouse cannot answer this yet (not built or not rated); retry later"},
        )

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    return app
