"""Cross-tenant tricks against the running service: ids, filters, query parameters, path
traversal, header and cookie spoofing, bodies naming a tenant. Acting as acme-research, no
answer may carry another tenant's rows, and another tenant's resource must answer 404."""

from __future__ import annotations

import json

from service_harness.kit import ACME, BLUE, call

OTHERS = (BLUE, "cobalt-labs", "delta-vision", f"drain-{BLUE}", f"task-{BLUE}")
ME_ENDPOINTS = (
    "/v1/me",
    "/v1/me/usage",
    "/v1/me/usage?grain=day",
    "/v1/me/invoices",
    "/v1/me/costs/daily",
    "/v1/me/drains",
    "/v1/me/notices",
    "/v1/me/balance",
    "/v1/me/webhooks",
    "/v1/me/webhooks/deliveries",
)


def _tricks(keys: dict[str, str], blue_hook: str) -> list[tuple[str, str, str, dict | None, dict, set[int]]]:
    """(name, method, path, body, headers, acceptable statuses)."""
    blue = keys["blue"]
    tricks: list = []
    for path in ME_ENDPOINTS:  # query parameters naming the other tenant
        sep = "&" if "?" in path else "?"
        for param in ("tenant", "tenant_id", "BillingAccountId"):
            tricks.append((f"param {param} {path}", "GET", f"{path}{sep}{param}={BLUE}", None, {}, {200}))
    for path in ("/v1/me", "/v1/me/drains", "/v1/me/usage", "/v1/me/balance"):  # spoofed identity headers
        for header in ("X-Tenant-Id", "X-Forwarded-User", "X-Remote-User", "X-Api-Key"):
            value = blue if header == "X-Api-Key" else BLUE
            tricks.append((f"header {header} {path}", "GET", path, None, {header: value}, {200}))
        tricks.append(
            (
                f"cookie of blue + bearer of acme {path}",
                "GET",
                path,
                None,
                {"Cookie": f"mp_key={blue}"},
                {200},
            )
        )
    for decision in (
        f"drain-{BLUE}-2",
        f"drain-{BLUE}-3",
        f"drain-{BLUE}-2%00",
        f"drain-{BLUE}-2%20",
        f"DRAIN-{BLUE.upper()}-2",
        f"drain-{BLUE}-2'--",
        "drain-%25",
        "*",
    ):
        tricks.append(
            (f"other's drain id {decision}", "GET", f"/v1/me/drains/{decision}", None, {}, {404, 422})
        )
    for path in (
        "/v1/me/drains/..%2F..%2Fv1%2Foperator%2Fdecisions",
        "/v1/me/drains/../../operator/decisions",
        "/v1/me/../operator/decisions",
        "/v1/me/%2e%2e/operator/ticks",
        "/v1/operator/decisions",
        f"/v1/operator/decisions?tenant={BLUE}",
        "/v1/operator/ticks",
        "/V1/me/drains",
        f"/v1/tenants/{BLUE}/drains",
        f"/v1/me/drains?decision_id=drain-{BLUE}-2",
        f"/console/operator/tenants/{BLUE}",
        "/console/operator/search?tenant=" + BLUE,
        f"/console/operator/tenants/..%2F{BLUE}",
        "/console/operator",
    ):
        tricks.append((f"path {path}", "GET", path, None, {}, {200, 303, 403, 404, 422}))
    tricks.append(("delete blue's webhook", "DELETE", f"/v1/me/webhooks/{blue_hook}", None, {}, {404}))
    tricks.append(
        (
            "hard cap naming blue",
            "PUT",
            "/v1/me/hard-cap",
            {"tenant_id": BLUE, "hard_cap_daily": "1"},
            {},
            {422},
        )
    )
    tricks.append(
        (
            "webhook naming blue",
            "POST",
            "/v1/me/webhooks",
            {"url": "http://127.0.0.1:9/x", "tenant_id": BLUE},
            {},
            {422},
        )
    )
    for value in (f"' OR tenant_id = '{BLUE}", "%' OR '1'='1", f"{BLUE}'; --"):  # filters
        tricks.append((f"pool filter {value}", "GET", f"/v1/prices/history?pool={value}", None, {}, {422}))
        tricks.append((f"since filter {value}", "GET", f"/v1/me/usage?since={value}", None, {}, {422}))
        tricks.append((f"grain filter {value}", "GET", f"/v1/me/usage?grain={value}", None, {}, {422}))
    return tricks


def test_fifty_cross_tenant_tricks_find_no_breach(served):
    server, keys = served
    status, hook, _ = call(
        server.base, "/v1/me/webhooks", keys["blue"], "POST", {"url": "http://127.0.0.1:9/blue"}
    )
    assert status == 201
    tricks = _tricks(keys, hook["webhook_id"])
    assert len(tricks) >= 50
    breaches = []
    from urllib.parse import quote as q

    for name, method, path, body, headers, ok in tricks:
        safe = "".join(ch if ch not in " '" else q(ch) for ch in path)
        status, answer, _ = call(server.base, safe, keys["acme"], method, body, headers)
        text = answer if isinstance(answer, str) else json.dumps(answer)
        leaked = [o for o in OTHERS if o in text]
        if status not in ok or leaked or ("/operator" in path and status == 200):
            breaches.append((name, status, leaked))
    assert breaches == [], breaches
    # blue's hook is still there, and acme sees only its own
    assert [h["webhook_id"] for h in call(server.base, "/v1/me/webhooks", keys["blue"])[1]] == [
        hook["webhook_id"]
    ]
    assert hook["webhook_id"] not in json.dumps(call(server.base, "/v1/me/webhooks", keys["acme"])[1])
    # and acme's answers do carry acme's rows (the tricks were answered, not just refused)
    assert ACME in json.dumps(call(server.base, f"/v1/me/drains?tenant={BLUE}", keys["acme"])[1])
