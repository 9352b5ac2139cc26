"""Drain-warning webhooks end to end: real drains in another process write the outbox, the
server's delivery worker posts signed notices to receivers on 127.0.0.1, one of which fails
every other call. Nothing is lost, no delivery id arrives twice, only registered URLs are
called, and a notice reaches its receiver soon after the warning."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service_harness.kit import ACME, BLUE, Receiver, call, start_server

from market_pipeline.service.context import ServiceContext
from market_pipeline.service.webhooks import verify
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.notice_outbox import NoticeOutbox, notices_path

DRAINS = int(os.environ.get("MP_TEST_WEBHOOK_DRAINS", "20"))
BURST = Path(__file__).parent / "service_harness" / "drain_burst.py"


def test_drain_warnings_reach_receivers_signed_once_per_delivery_id(service_config, tmp_path):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    config = service_config.model_copy(
        update={
            "service": service_config.service.model_copy(
                update={
                    "store_path": str(tmp_path / "s.sqlite"),
                    "webhook_poll_seconds": 0.05,
                    "webhook_backoff_seconds": 0.1,
                    "webhook_backoff_max_seconds": 0.5,
                    "webhook_max_attempts": 50,
                    "rate_limit_per_second": 1000.0,
                    "rate_limit_burst": 1000,
                }
            )
        }
    )
    context = ServiceContext.build(config, str(warehouse.path))
    acme_key = context.store.create_key("tenant", ACME)[1]
    blue_key = context.store.create_key("tenant", BLUE)[1]
    flaky, steady, unregistered = Receiver(fail_every=2).start(), Receiver().start(), Receiver().start()
    server = start_server(context, deliver_webhooks=True)
    try:
        status, acme_hook, _ = call(server.base, "/v1/me/webhooks", acme_key, "POST", {"url": flaky.url})
        assert status == 201 and acme_hook["secret"]
        status, blue_hook, _ = call(server.base, "/v1/me/webhooks", blue_key, "POST", {"url": steady.url})
        assert status == 201
        burst = subprocess.run(
            [sys.executable, str(BURST), str(warehouse.path), str(DRAINS), "0.2", ACME, BLUE],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert burst.returncode == 0, burst.stderr[-2000:]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = dict(context.store.read("SELECT state, count(*) FROM webhook_jobs GROUP BY state"))
            if states.get("delivered", 0) == DRAINS:
                break
            time.sleep(0.2)
        assert states == {"delivered": DRAINS}, states

        outbox = {
            r["drain_id"]: r
            for r in warehouse.query(
                "SELECT drain_id, tenant_id, warned_at FROM drain_warning_outbox"
            ).to_dicts()
        }
        assert len(outbox) == DRAINS
        # each drain put its warning in the notice file beside the warehouse too (the fast path)
        assert {w.drain_id for w in NoticeOutbox(notices_path(warehouse.path)).after(0)} == set(outbox)
        latencies, seen_ids = [], set()
        for receiver, hook, tenant in ((flaky, acme_hook, ACME), (steady, blue_hook, BLUE)):
            got: dict[str, float] = {}
            for c in receiver.calls:
                delivery = c["headers"]["x-mp-delivery-id"]
                assert delivery not in seen_ids  # at most once per delivery id
                seen_ids.add(delivery)
                assert verify(hook["secret"], c["headers"]["x-mp-signature"], c["body"], time.time())
                body = json.loads(c["body"])
                assert body["tenant_id"] == tenant  # a receiver gets only its tenant's notices
                assert c["headers"]["x-mp-notice-id"] == body["notice_id"]
                if c["ok"] and body["drain_id"] not in got:
                    got[body["drain_id"]] = c["at"]
                    warned = dt.datetime.fromisoformat(body["warned_at"])
                    assert dt.datetime.fromisoformat(body["expected_drain_at"]) == warned + dt.timedelta(
                        seconds=body["notice_seconds"]
                    )
                    assert body["reasons"] == ["under_used: burst"] and body["task_id"].startswith("burst-")
                    assert "checkpoint" in body["how_to_get_a_longer_notice"]
            mine = {d for d, r in outbox.items() if r["tenant_id"] == tenant}
            assert set(got) == mine  # none lost
            latencies += [got[d] - outbox[d]["warned_at"].timestamp() for d in mine]
        assert len(flaky.calls) > DRAINS // 2  # its failures were retried
        assert unregistered.calls == []
        latencies.sort()
        p99 = latencies[int(0.99 * (len(latencies) - 1))]
        print(
            json.dumps(
                {
                    "drains": DRAINS,
                    "p50_s": round(latencies[len(latencies) // 2], 3),
                    "p99_s": round(p99, 3),
                    "max_s": round(latencies[-1], 3),
                    "flaky_calls": len(flaky.calls),
                    "burst": json.loads(burst.stdout),
                }
            )
        )
        # soon after the warning, not after the backoff's later rounds; the 1 s target is
        # measured on an idle machine (docs/service.md), this suite runs on loaded shared cores
        assert latencies[len(latencies) // 2] < 5.0
        # the tenant sees its notices, delivered
        status, notices, _ = call(server.base, "/v1/me/notices", acme_key)
        assert status == 200 and notices["rows"] and all(n["webhook_delivered"] for n in notices["rows"])
        assert {n["tenant_id"] for n in notices["rows"]} == {ACME}
    finally:
        server.stop()
        for r in (flaky, steady, unregistered):
            r.stop()


def test_a_lost_receiver_holds_up_no_drain(service_config, tmp_path):
    """No receiver listens: drains still finish at their own pace; jobs wait for retries."""
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    config = service_config.model_copy(
        update={
            "service": service_config.service.model_copy(
                # attempts enough that no job gives up however long the loaded machine takes
                update={
                    "store_path": str(tmp_path / "s.sqlite"),
                    "webhook_poll_seconds": 0.05,
                    "webhook_max_attempts": 100,
                }
            )
        }
    )
    context = ServiceContext.build(config, str(warehouse.path))
    gone = Receiver().start()
    url = gone.url
    gone.stop()  # nobody listens there any more
    context.store.register_webhook(ACME, url)
    server = start_server(context, deliver_webhooks=True)
    try:
        started = time.monotonic()
        burst = subprocess.run(
            [sys.executable, str(BURST), str(warehouse.path), "3", "0", ACME],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert burst.returncode == 0, burst.stderr[-2000:]
        assert time.monotonic() - started < 60
        reports = warehouse.query("SELECT count(*) AS n FROM drain_audit WHERE state = 'reported'")["n"][0]
        assert reports == 3
        # an attempt is 'sending' from its claim until the refused connection is written back,
        # and a warning's job is made when the worker picks the notice up: wait (bounded) for
        # every warning's job and every attempt's answer; a lost job still fails below
        deadline = time.monotonic() + 20

        def settled() -> tuple[list, dict]:
            failed = context.store.deliveries(ACME)
            states = dict(context.store.read("SELECT state, count(*) FROM webhook_jobs GROUP BY state"))
            return failed, states

        failed, states = settled()
        while time.monotonic() < deadline and (
            not failed or any(d["state"] == "sending" for d in failed) or sum(states.values()) < 3
        ):
            time.sleep(0.1)
            failed, states = settled()
        assert failed and all(d["state"] == "failed" for d in failed), failed
        assert states == {"pending": 3}
    finally:
        server.stop()


def test_webhooks_deliver_once_command_sends_what_the_outbox_holds(service_config, tmp_path, monkeypatch):
    """`market-pipeline webhooks deliver --once`: the worker outside the server."""
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    store_path = tmp_path / "s.sqlite"
    receiver = Receiver().start()
    try:
        config = service_config.model_copy(
            update={"service": service_config.service.model_copy(update={"store_path": str(store_path)})}
        )
        ServiceContext.build(config, str(warehouse.path)).store.register_webhook(ACME, receiver.url)
        burst = subprocess.run(
            [sys.executable, str(BURST), str(warehouse.path), "2", "0", ACME, BLUE],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert burst.returncode == 0, burst.stderr[-2000:]
        monkeypatch.setenv("MP__SERVICE__STORE_PATH", str(store_path))
        command = [
            sys.executable,
            "-m",
            "market_pipeline.cli",
            "webhooks",
            "deliver",
            "--once",
            "--warehouse",
            str(warehouse.path),
        ]
        first = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout) == {"delivered": 1}  # acme's one drain; blue registered nothing
        again = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert json.loads(again.stdout) == {"delivered": 0}  # taken once
        assert [json.loads(c["body"])["tenant_id"] for c in receiver.calls] == [ACME]
    finally:
        receiver.stop()


@pytest.mark.slow  # a spawned server and real worker processes: about a minute on loaded cores
def test_bench_webhooks_counts_every_notice_once(service_config):
    """`bench webhooks` on a few drains: real toy workers drained through the local-process
    adapter, the real server's worker, receivers failing every other call. Every warning is
    delivered, no delivery id twice, every signature valid, the failures retried."""
    from market_pipeline.lab.service.webhook_bench import run_webhook_bench

    tenants = len(service_config.tenants)  # one more drain than tenants: a receiver's 2nd call fails
    result = run_webhook_bench(
        service_config, drains=tenants + 1, writers=1, fail_every=2, gap=0.0, settle_seconds=60
    )
    assert result["failed_writers"] == 0 and result["warnings_in_outbox"] == tenants + 1
    assert result["lost"] == 0 and result["notices_delivered"] == tenants + 1
    assert (
        result["repeated_delivery_ids"] == 0 and result["bad_signatures"] == 0 and result["wrong_tenant"] == 0
    )
    assert (
        result["failed_calls"] >= 1
        and result["calls"] == result["notices_delivered"] + result["failed_calls"]
    )
    assert result["latency_s"]["max"] < 30
