"""`market-pipeline bench webhooks`: N real drains, each warning its tenant through the
service's webhook path, to receivers that fail every `fail_every`-th call.

- The drains are real: `drains_per_writer` toy workers per node are launched through the
  `local-process` adapter (real OS processes, real SIGUSR1 warnings, checkpoint files,
  SIGTERM), and each is drained by the `DrainExecutor` on the warehouse audit store with a
  short connection per step, as the loop's drain job writes it. `writers` processes (one
  node each) drain at once, so the warehouse's single writer lock changes hands all the time.
- The service is the real app under uvicorn in its own process, its delivery worker a thread
  of it, with the configured poll, timeout and backoff (only its key store is a scratch one).
- Each tenant of the configuration registers one receiver on 127.0.0.1; every receiver
  fails every `fail_every`-th call (2: half its calls).

Measured: notices lost (a warning in the outbox that no receiver got with a 2xx), notices
delivered twice with a 2xx, delivery ids seen twice, bad signatures, the latency from the
warning step (its audit row's time) to the first 2xx at the receiver (and to the first
attempt, whatever its answer: the notice's way to the worker without the retry), and calls
per notice. The notices reach the worker through the notice file beside the warehouse and
its bell (warehouse/notice_outbox.py); the bench counts them from the warehouse's outbox.
The drains' timing is short (the notice path is what is measured, not a task's checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.service.receiver import Receiver

LATENCY_TARGET_S = 1.0
TIMING = {
    "warn_seconds": 0.05,
    "checkpoint_timeout_seconds": 2.0,
    "terminate_timeout_seconds": 2.0,
    "max_total_seconds": 30.0,
    "kill_timeout_seconds": 2.0,
    "verify_timeout_seconds": 1.0,
    "release_timeout_seconds": 2.0,
    "call_margin_seconds": 3.0,
    "poll_seconds": 0.02,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(config: MarketPipelineConfig, warehouse: str, port: int) -> None:
    import uvicorn

    from market_pipeline.service.app import create_app
    from market_pipeline.service.context import ServiceContext

    app = create_app(ServiceContext.build(config, warehouse), deliver_webhooks=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _drain_writer(
    warehouse_path: str,
    workdir: str,
    node: int,
    tenants: list[str],
    ids: list[int],
    per_drain: bool,
    gap: float,
) -> None:
    """One node's drains, one after another (its own process), `gap` seconds apart; each holds
    one warehouse connection (`per_drain`, as `market-pipeline drain` does) or opens one per
    step (as the loop's drain job does)."""
    from market_pipeline.drain.calls import SystemClock
    from market_pipeline.drain.executor import DrainExecutor, DrainRequest
    from market_pipeline.drain.steps import DrainTiming
    from market_pipeline.drain.store import WarehouseAuditStore
    from market_pipeline.hardware.local_process.adapter import LocalProcessAdapter, WorkerOptions
    from market_pipeline.warehouse import Warehouse

    root = Path(workdir) / f"node{node}"
    adapter = LocalProcessAdapter(
        root / "registry.json",
        root / "tasks",
        node_id=f"bench-node-{node}",
        pool_id="bench@local",
        gpu_model="bench",
        zone="local",
        gpu_slots=1,
        use_nvml=False,
    )
    warehouse = Warehouse(Path(warehouse_path))
    for i in ids:
        task = adapter.launch_task(
            task_id=f"bench-task-{i}",
            tenant_id=tenants[i % len(tenants)],
            options=WorkerOptions(step_seconds=0.2, metrics_seconds=60.0),
        )
        request = DrainRequest(f"bench-drain-{i}", task, reasons=("under_used: bench webhooks",))
        with contextlib.ExitStack() as stack:
            con = stack.enter_context(warehouse.connect()) if per_drain else None
            store = WarehouseAuditStore(warehouse, connection=con)
            report = DrainExecutor(adapter, store, DrainTiming(**TIMING), clock=SystemClock()).run(request)
        if not report.terminal:
            raise RuntimeError(f"drain bench-drain-{i} did not finish: {report.states}")
        time.sleep(gap)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def run_webhook_bench(
    config: MarketPipelineConfig,
    drains: int,
    writers: int = 1,
    fail_every: int = 2,
    connection: str = "per-drain",
    gap: float = 0.1,
    settle_seconds: float = 120,
) -> dict:
    from market_pipeline.service.keystore import KeyStore
    from market_pipeline.service.webhooks import verify
    from market_pipeline.warehouse import drain_outbox, open_warehouse

    if drains < 1 or writers < 1:
        raise ValueError("--drains and --writers must be at least 1")
    if connection not in ("per-drain", "per-step"):
        raise ValueError(f"--connection must be per-drain or per-step, not {connection!r}")
    tenants = [t.id for t in config.tenants]
    if not tenants:
        raise ValueError("the configuration has no tenants to warn")
    scratch = Path(tempfile.mkdtemp(prefix="bench-webhooks-"))
    warehouse = open_warehouse(scratch / "warehouse.duckdb")
    service = config.service.model_copy(update={"store_path": str(scratch / "service.sqlite")})
    config = config.model_copy(update={"service": service})
    store = KeyStore(scratch / "service.sqlite")
    receivers = {t: Receiver(fail_every=fail_every).start() for t in tenants}
    hooks = {t: store.register_webhook(t, r.url) for t, r in receivers.items()}
    spawn = multiprocessing.get_context("spawn")
    port = _free_port()
    server = spawn.Process(target=_serve, args=(config, str(warehouse.path), port), daemon=True)
    server.start()
    procs = []
    try:
        deadline = time.monotonic() + 60
        while True:  # the server (and its delivery worker) is up once it answers
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or not server.is_alive():
                    raise RuntimeError("the service did not start within 60 s") from None
                time.sleep(0.1)
        started = time.monotonic()
        shards = [list(range(k, drains, writers)) for k in range(writers)]
        procs = [
            spawn.Process(
                target=_drain_writer,
                args=(str(warehouse.path), str(scratch), k, tenants, ids, connection == "per-drain", gap),
            )
            for k, ids in enumerate(shards)
            if ids
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        drain_seconds = time.monotonic() - started
        failed_writers = [p.exitcode for p in procs if p.exitcode != 0]
        warned = {r["drain_id"]: r for r in drain_outbox.warning_times(warehouse).to_dicts()}
        deadline = time.monotonic() + settle_seconds
        while time.monotonic() < deadline:  # the retries' tail
            got = {json.loads(c["body"])["drain_id"] for r in receivers.values() for c in r.calls if c["ok"]}
            if set(warned) <= got:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        server.terminate()
        server.join(timeout=10)
        for r in receivers.values():
            r.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    first_ok: dict[str, float] = {}
    first_call: dict[str, float] = {}
    ok_count: dict[str, int] = {}
    delivery_ids: set[str] = set()
    repeated_ids = bad_signatures = wrong_tenant = calls = failed_calls = 0
    for tenant, receiver in receivers.items():
        for c in receiver.calls:
            calls += 1
            failed_calls += 0 if c["ok"] else 1
            delivery = c["headers"].get("x-mp-delivery-id", "")
            repeated_ids += delivery in delivery_ids
            delivery_ids.add(delivery)
            bad_signatures += not verify(
                hooks[tenant].secret, c["headers"].get("x-mp-signature", ""), c["body"], c["at"]
            )
            body = json.loads(c["body"])
            wrong_tenant += body["tenant_id"] != tenant
            first_call.setdefault(body["drain_id"], c["at"])
            if c["ok"]:
                ok_count[body["drain_id"]] = ok_count.get(body["drain_id"], 0) + 1
                first_ok.setdefault(body["drain_id"], c["at"])
    latencies = [first_ok[d] - r["warned_at"].timestamp() for d, r in warned.items() if d in first_ok]
    # the first attempt, whatever its answer: the outbox read and the send, without the retry
    first = [first_call[d] - r["warned_at"].timestamp() for d, r in warned.items() if d in first_call]
    lost = len([d for d in warned if d not in first_ok])
    result = {
        "bench": "webhooks",
        "cpus": os.cpu_count(),
        "drains": drains,
        "writers": writers,
        "connection": connection,
        "gap_seconds": gap,
        "tenants": len(tenants),
        "receiver_fails_every": fail_every,
        "drain_seconds": round(drain_seconds, 1),
        "drains_per_second": round(drains / drain_seconds, 2),
        "failed_writers": len(failed_writers),
        "warnings_in_outbox": len(warned),
        "notices_delivered": len(first_ok),
        "lost": lost + (drains - len(warned)),
        "delivered_twice": sum(1 for n in ok_count.values() if n > 1),
        "repeated_delivery_ids": repeated_ids,
        "bad_signatures": bad_signatures,
        "wrong_tenant": wrong_tenant,
        "calls": calls,
        "failed_calls": failed_calls,
        "calls_per_notice": round(calls / max(1, len(first_ok)), 3),
        "latency_s": {
            "p50": round(_percentile(latencies, 0.50), 3),
            "p90": round(_percentile(latencies, 0.90), 3),
            "p99": round(_percentile(latencies, 0.99), 3),
            "max": round(max(latencies), 3) if latencies else None,
            "over_target": sum(1 for x in latencies if x > LATENCY_TARGET_S),
        },
        "first_attempt_latency_s": {
            "p50": round(_percentile(first, 0.50), 3),
            "p99": round(_percentile(first, 0.99), 3),
            "max": round(max(first), 3) if first else None,
        },
        "service": {
            "webhook_poll_seconds": service.webhook_poll_seconds,
            "webhook_backoff_seconds": service.webhook_backoff_seconds,
            "webhook_max_attempts": service.webhook_max_attempts,
        },
        "targets": {"latency_p99_s": LATENCY_TARGET_S, "lost": 0, "repeated_delivery_ids": 0},
    }
    result["meets_targets"] = (
        not failed_writers
        and result["lost"] == 0
        and repeated_ids == 0
        and bad_signatures == 0
        and wrong_tenant == 0
        and result["latency_s"]["p99"] <= LATENCY_TARGET_S
    )
    return result
