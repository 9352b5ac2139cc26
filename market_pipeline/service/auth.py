"""Who is calling: the API key in `Authorization: Bearer <key>` (the console's login keeps it
in an HttpOnly cookie instead). Unknown, malformed or revoked keys get 401; a key over its
rate gets 429 with Retry-After; a tenant key on an operator page gets 403. The tenant a
request acts for is always the key's: no header, parameter or body field can name another.
"""

from __future__ import annotations

import math

from fastapi import HTTPException, Request

from market_pipeline.service.context import ServiceContext
from market_pipeline.service.keystore import ROLE_OPERATOR, ROLE_TENANT, Principal

COOKIE = "mp_key"


def context_of(request: Request) -> ServiceContext:
    return request.app.state.context


def presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else ""
    return request.cookies.get(COOKIE)


def principal(request: Request) -> Principal:
    key = presented_key(request)
    found = context_of(request).store.authenticate(key) if key else None
    if found is None:
        raise HTTPException(
            status_code=401,
            detail="missing, unknown or revoked API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    allowed, wait = context_of(request).limiter.allow(found.key_id)
    if not allowed:
        raise HTTPException(
            status_code=429,
            detail="rate limit exceeded for this key",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    request.state.principal = found
    return found


def tenant(request: Request) -> Principal:
    found = principal(request)
    if found.role != ROLE_TENANT or not found.tenant_id:
        raise HTTPException(status_code=403, detail="this endpoint needs a tenant key")
    return found


def operator(request: Request) -> Principal:
    found = principal(request)
    if found.role != ROLE_OPERATOR:
        raise HTTPException(status_code=403, detail="this page needs the operator key")
    return found
