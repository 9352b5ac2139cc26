"""The tenant API over a real uvicorn server: prices, quotes (the CLI's numbers), my usage by
component (the marts' numbers), drains, balance, hard cap, webhooks; auth and bad input."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import subprocess
import sys

import pytest
from service_harness.kit import A10, A100, ACME, BLUE, call, start_server

from market_pipeline.billing.quotes import quote
from market_pipeline.service.context import ServiceContext
from market_pipeline.service.ratelimit import RateLimiter


def test_prices_now_and_history(served):
    server, keys = served
    status, body, _ = call(server.base, "/v1/prices", keys["acme"])
    assert status == 200
    got = {(p["pool_id"], p["resource_class"]): p["price_per_gpu_hour"] for p in body["prices"]}
    # the scenario's book: A100 guaranteed 2.4 then 3.0 at 09:10; drainable 1.5; A10 0.7
    assert (
        got[(A100, "guaranteed")] == 3.0
        and got[(A100, "drainable")] == 1.5
        and got[(A10, "guaranteed")] == 0.7
    )
    status, body, _ = call(
        server.base, f"/v1/prices/history?pool={A100}&resource_class=guaranteed", keys["acme"]
    )
    assert status == 200
    assert [p["price"] for p in body["points"]] == [2.4, 3.0]


def test_quote_is_the_quote_commands_numbers(served, service_config):
    server, keys = served
    start = "2026-03-02T12:00:00+00:00"
    status, body, _ = call(
        server.base, f"/v1/quote?pool={A100}&gpus=2&hours=3&start={start.replace('+', '%2B')}", keys["acme"]
    )
    assert status == 200, body
    expected = quote(
        service_config,
        server.context.warehouse,
        ACME,
        A100,
        2,
        3,
        "guaranteed",
        dt.datetime.fromisoformat(start),
    ).as_json()
    assert body == expected
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "market_pipeline.cli",
            "quote",
            "--tenant",
            ACME,
            "--pool",
            A100,
            "--gpus",
            "2",
            "--hours",
            "3",
            "--start",
            start,
            "--warehouse",
            str(server.context.warehouse.path),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(cli.stdout) == body
    assert body["low_90"] <= body["expected_cost"] <= body["high_90"]


def test_my_usage_is_the_marts_rows_broken_down(served):
    server, keys = served
    status, body, _ = call(server.base, "/v1/me/usage?grain=hour", keys["acme"])
    assert status == 200
    mart = server.context.warehouse.query(
        "SELECT sum(billed_cost)::DOUBLE AS b, sum(base_cost)::DOUBLE AS base FROM fct_invoice_lines"
        " WHERE tenant_id = ? AND period_grain = 'hour'",
        [ACME],
    ).row(0)
    assert body["rows"] and {r["pool_id"] for r in body["rows"]} <= {A100}
    assert sum(r["billed_cost"] for r in body["rows"]) == pytest.approx(mart[0])
    assert sum(r["base_cost"] for r in body["rows"]) == pytest.approx(mart[1])
    for row in body["rows"]:  # the components add up to the bill (billing's own identity)
        parts = sum(
            row[c]
            for c in (
                "base_cost",
                "time_premium",
                "location_premium",
                "drainability_discount",
                "commitment_discount",
                "sla_credit",
            )
        )
        assert parts == pytest.approx(row["billed_cost"], abs=1e-6)
    status, invoices, _ = call(server.base, "/v1/me/invoices", keys["acme"])
    assert status == 200 and all(
        i["invoice_id"].endswith(ACME) or ACME in i["invoice_id"] for i in invoices["rows"]
    )
    status, daily, _ = call(server.base, "/v1/me/costs/daily", keys["blue"])
    assert status == 200 and daily["rows"] and daily["tenant_id"] == BLUE


def test_drains_balance_and_hard_cap(served):
    server, keys = served
    status, body, _ = call(server.base, "/v1/me/drains", keys["acme"])
    assert status == 200
    assert {r["decision_id"] for r in body["rows"]} == {f"drain-{ACME}-0", f"drain-{ACME}-1"}
    assert {r["outcome"] for r in body["rows"]} == {"terminated", "failed"}
    assert call(server.base, f"/v1/me/drains/drain-{ACME}-1", keys["acme"])[0] == 200
    assert call(server.base, f"/v1/me/drains/drain-{BLUE}-2", keys["acme"])[0] == 404
    status, balance, _ = call(server.base, "/v1/me/balance", keys["blue"])
    assert status == 200 and balance["tenant_id"] == BLUE and balance["guarded"] is False
    status, balance, _ = call(
        server.base, "/v1/me/hard-cap", keys["blue"], "PUT", {"hard_cap_daily": "125.5"}
    )
    assert status == 200, balance
    assert balance["hard_cap_daily"] == "125.5" and balance["guarded"] is True
    stored = server.context.warehouse.query(
        "SELECT tenant_id, hard_cap_daily::DOUBLE AS cap FROM billing_accounts"
    ).rows()
    assert stored == [(BLUE, 125.5)]  # only my account, only my cap
    status, balance, _ = call(server.base, "/v1/me/hard-cap", keys["blue"], "PUT", {"hard_cap_daily": None})
    assert status == 200 and balance["hard_cap_daily"] is None


@pytest.mark.parametrize(
    ("path", "method", "body", "field"),
    [
        (f"/v1/quote?pool={A100}&gpus=-1&hours=2", "GET", None, "gpus"),
        (f"/v1/quote?pool={A100}&gpus=abc&hours=2", "GET", None, "gpus"),
        (f"/v1/quote?pool={A100}&gpus=1&hours=0", "GET", None, "hours"),
        (f"/v1/quote?pool={A100}&gpus=1&hours=nan", "GET", None, "hours"),
        ("/v1/quote?pool=nowhere&gpus=1&hours=1", "GET", None, "pool"),
        (f"/v1/quote?pool={A100}&gpus=1&hours=1&resource_class=gold", "GET", None, "resource_class"),
        (f"/v1/quote?pool={A100}&gpus=1&hours=1&start=yesterday", "GET", None, "start"),
        (f"/v1/quote?pool={A100}&gpus=100000&hours=1", "GET", None, "gpus"),
        ("/v1/prices/history?limit=0", "GET", None, "limit"),
        ("/v1/me/usage?grain=week", "GET", None, "grain"),
        ("/v1/me/hard-cap", "PUT", {"hard_cap_daily": "-3"}, "hard_cap_daily"),
        ("/v1/me/hard-cap", "PUT", {"hard_cap_daily": "lots"}, "hard_cap_daily"),
        ("/v1/me/hard-cap", "PUT", {"tenant_id": BLUE, "hard_cap_daily": 1}, "tenant_id"),
        ("/v1/me/webhooks", "POST", {"url": "ftp://x/y"}, "url"),
        ("/v1/me/webhooks", "POST", {"url": "not a url"}, "url"),
        ("/v1/me/webhooks", "POST", {}, "url"),
    ],
)
def test_malformed_input_is_422_naming_the_field(served, path, method, body, field):
    server, keys = served
    status, answer, _ = call(server.base, path, keys["acme"], method, body)
    assert status == 422, answer
    assert any(field in [str(x) for x in e["loc"]] for e in answer["detail"]), answer


def test_malformed_json_body_is_422(served):
    server, keys = served
    status, answer, _ = call(server.base, "/v1/me/hard-cap", keys["acme"], "PUT", b"{not json")
    assert status == 422 and answer["detail"]


def test_wrong_missing_and_revoked_keys_get_401(served):
    server, keys = served
    assert call(server.base, "/v1/prices")[0] == 401
    assert call(server.base, "/v1/prices", "mpk_nope_nope")[0] == 401
    assert call(server.base, "/v1/prices", keys["acme"] + "x")[0] == 401
    assert call(server.base, "/v1/prices", headers={"Authorization": "Basic " + keys["acme"]})[0] == 401
    key_id, key = server.context.store.create_key("tenant", ACME)
    assert call(server.base, "/v1/me", key)[0] == 200
    server.context.store.revoke(key_id=key_id)
    assert call(server.base, "/v1/me", key)[0] == 401
    assert call(server.base, "/v1/operator/decisions", keys["acme"])[0] == 403
    assert call(server.base, "/v1/me", keys["operator"])[0] == 403


def test_rate_limit_per_key(service_config, service_warehouse, tmp_path):
    config = service_config.model_copy(
        update={
            "service": service_config.service.model_copy(
                update={
                    "store_path": str(tmp_path / "s.sqlite"),
                    "rate_limit_per_second": 0.5,
                    "rate_limit_burst": 3,
                }
            )
        }
    )
    # the limiter's clock stands still unless the test moves it: a slow request on loaded
    # cores refills no token behind the test's back
    now = [0.0]
    context = dataclasses.replace(
        ServiceContext.build(config, str(service_warehouse.path)),
        limiter=RateLimiter(0.5, 3, clock=lambda: now[0]),
    )
    a, b = context.store.create_key("tenant", ACME)[1], context.store.create_key("tenant", ACME)[1]
    server = start_server(context)
    try:
        statuses = [call(server.base, "/v1/me", a)[0] for _ in range(5)]
        assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429]
        status, _, headers = call(server.base, "/v1/me", a)
        assert status == 429 and headers["retry-after"] == "2"  # one token at 0.5 per second
        assert call(server.base, "/v1/me", b)[0] == 200  # per key: the other key is unaffected
        now[0] += 2.0  # one token refilled, one only
        assert [call(server.base, "/v1/me", a)[0] for _ in range(2)] == [200, 429]
    finally:
        server.stop()


def test_cors_closed_and_openapi_served(served):
    server, keys = served
    status, _, headers = call(
        server.base, "/v1/prices", keys["acme"], headers={"Origin": "https://evil.example"}
    )
    assert status == 200 and "access-control-allow-origin" not in headers
    status, _, headers = call(
        server.base,
        "/v1/prices",
        None,
        "OPTIONS",
        None,
        {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in headers
    status, schema, _ = call(server.base, "/openapi.json")
    assert status == 200
    assert {"/v1/prices", "/v1/quote", "/v1/me/usage", "/v1/me/hard-cap", "/v1/me/webhooks"} <= set(
        schema["paths"]
    )


def test_no_secret_is_logged(served, caplog):
    server, keys = served
    caplog.set_level(logging.DEBUG)
    call(server.base, "/v1/prices", keys["acme"])
    call(server.base, "/v1/prices", keys["acme"] + "bad")
    call(server.base, "/v1/me/webhooks", keys["acme"], "POST", {"url": "http://127.0.0.1:9/h"})
    text = caplog.text
    assert keys["acme"] not in text and keys["acme"][-20:] not in text
    hook_secret = server.context.store.webhooks(ACME)[0].secret
    assert hook_secret not in text
    raw = server.context.store.read("SELECT key_hash FROM api_keys")
    assert all(keys["acme"] not in r[0] for r in raw)  # stored hashed


def test_tenant_key_cli_creates_and_revokes(tmp_path, monkeypatch):
    monkeypatch.setenv("MP__SERVICE__STORE_PATH", str(tmp_path / "k.sqlite"))
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "market_pipeline.cli", *a], capture_output=True, text=True
    )
    made = run("tenant-key", "create", "--tenant", ACME)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["key"].startswith("mpk_")
    bad = run("tenant-key", "create", "--tenant", "nobody")
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: unknown tenant")
        and "Traceback" not in bad.stderr
    )
    listed = run("tenant-key", "list")
    assert created["key"] not in listed.stdout and created["key_id"] in listed.stdout
    revoked = run("tenant-key", "revoke", "--tenant", ACME)
    assert json.loads(revoked.stdout) == {"revoked": 1}
