"""Service test kit: a small rated warehouse with ticks, drains and telemetry of two tenants,
a real uvicorn server on a free 127.0.0.1 port, and a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "billing"))

from billing_testkit import A10, A100, H800, HOURS, T0, build_scenario, rate_hours, scenario  # noqa: E402

from market_pipeline.billing.metering import HourWindow  # noqa: E402
from market_pipeline.config import MarketPipelineConfig  # noqa: E402
from market_pipeline.service.app import create_app  # noqa: E402
from market_pipeline.service.context import ServiceContext  # noqa: E402
from market_pipeline.service.receiver import Receiver  # noqa: E402,F401 - the tests import it from here
from market_pipeline.warehouse import Warehouse, writers  # noqa: E402

UTC = dt.timezone.utc
POOLS = (A100, H800, A10)
ACME, BLUE = "acme-research", "blue-inference"


def _ticks() -> pl.DataFrame:
    rows = []
    for i in range(6):
        for pool, base in ((A100, 2.4), (H800, 4.2), (A10, 0.7)):
            g = round(base * (1 + 0.02 * i), 6)
            rows.append(
                {
                    "tick_at": T0 + dt.timedelta(minutes=20 * i),
                    "solve_id": f"solve-{i}",
                    "pool_id": pool,
                    "status": "converged",
                    "list_price": base,
                    "solver_guaranteed": g,
                    "solver_drainable": round(g * 0.8, 6),
                    "guaranteed": g,
                    "drainable": round(g * 0.7, 6),
                    "guaranteed_reason": "as solved" if i % 2 else "backlog shield: raised",
                    "drainable_reason": "promise: drainable band",
                    "certified": True,
                    "margin": 0.5 - 0.1 * i,
                    "required_margin": 0.0,
                    "serving_gpus": 8.0,
                    "capacity_target_gpus": 8.0,
                    "equilibrium_price": g,
                    "shield_factor": 1.0,
                    "demand_gpus": 4.0 + i,
                    "backlog_gpus": 0.0,
                    "forecast_upper_gpus": 6.0,
                    "shadow": False,
                }
            )
    return pl.DataFrame(rows)


def _snapshots() -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "ts": T0 + dt.timedelta(minutes=30 * i),
                "pool_id": pool,
                "running_gpus": float(2 + (i + k) % 5),
                "pending_gpus": float(i % 2),
                "gpus_on": 8,
                "drainable_running_gpus": 1.0,
                "guaranteed_pending_gpus": 2.0 * (i % 2),
            }
            for i in range(8)
            for k, pool in enumerate(POOLS)
        ]
    )


def _decisions() -> pl.DataFrame:
    rows = []
    for i, (tenant, pool, outcome) in enumerate(
        [(ACME, A100, "terminated"), (ACME, A100, "failed"), (BLUE, A10, "killed"), (BLUE, H800, None)]
    ):
        rows.append(
            {
                "decision_id": f"drain-{tenant}-{i}",
                "kind": "drain",
                "pool_id": pool,
                "target": f"task-{tenant}-{i}",
                "action": "drain_task",
                "allowed": True,
                "shadow": False,
                "reasons": [f"under_used: task {i} of {tenant}"],
                "inputs": json.dumps({"tenant_id": tenant, "node_id": f"node-{i}"}),
                "decided_at": T0 + dt.timedelta(minutes=10 * i),
                "executed_at": None if outcome is None else T0 + dt.timedelta(minutes=10 * i + 1),
                "outcome": outcome,
                "batch_id": f"drain@{(T0 + dt.timedelta(minutes=10 * i)).isoformat()}",
            }
        )
    rows.append(
        {
            "decision_id": "scale-1",
            "kind": "scale",
            "pool_id": A100,
            "target": "node-1",
            "action": "scale_down",
            "allowed": True,
            "shadow": False,
            "reasons": ["idle: node-1"],
            "inputs": json.dumps({"node_id": "node-1"}),
            "decided_at": T0,
            "executed_at": T0,
            "outcome": "ok: powered off",
            "batch_id": f"scale@{T0.isoformat()}",
        }
    )
    return pl.DataFrame(rows)


def build_service_warehouse(path: Path, config: MarketPipelineConfig) -> Warehouse:
    """The billing scenario metered and rated (dbt run), plus ticks, snapshots and decisions."""
    warehouse = build_scenario(path, config, scenario())
    # both metered hours rated in one dbt run (the billing rollup over a two-hour window)
    rate_hours(warehouse, windows=[HourWindow(HOURS[0].start, HOURS[-1].end)], command="run")
    warehouse.append("market_ticks", _ticks())
    # the two latest ticks' latency, as their runs recorded it (the earlier ones: none)
    writers.record_tick_seconds(warehouse, T0 + dt.timedelta(minutes=80), 30.0)
    writers.record_tick_seconds(warehouse, T0 + dt.timedelta(minutes=100), 12.5)
    warehouse.append("pool_demand_snapshots", _snapshots())
    decisions = _decisions()
    with warehouse.connect() as con:
        con.register("_d", decisions.to_arrow())
        con.execute(
            "INSERT INTO decisions (decision_id, kind, pool_id, target, action, allowed, shadow, reasons,"
            " inputs, decided_at, executed_at, outcome, batch_id) SELECT decision_id, kind, pool_id, target,"
            " action, allowed, shadow, reasons, CAST(inputs AS JSON), decided_at, executed_at, outcome,"
            " batch_id FROM _d"
        )
    # what every service test reads: both tenants rated, every decision stored
    billed = {row[0] for row in warehouse.query("SELECT DISTINCT tenant_id FROM fct_invoice_lines").rows()}
    assert {ACME, BLUE} <= billed, f"the scenario rated {sorted(billed)}, not both tenants"
    stored = warehouse.query("SELECT count(*) FROM decisions").rows()[0][0]
    assert stored == decisions.height, f"{stored} decisions stored of {decisions.height}"
    return warehouse


@dataclass
class Server:
    base: str
    context: ServiceContext
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_server(context: ServiceContext, deliver_webhooks: bool = False) -> Server:
    """The app under a real uvicorn server on 127.0.0.1, a free port chosen by the OS."""
    config = uvicorn.Config(
        create_app(context, deliver_webhooks=deliver_webhooks),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return Server(f"http://127.0.0.1:{port}", context, server, thread)


def call(
    base: str,
    path: str,
    key: str | None = None,
    method: str = "GET",
    body: object = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, object, dict[str, str]]:
    """(status, JSON or text, headers) of one request."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(base + path, data=data, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw, hdrs = (
                response.status,
                response.read(),
                {k.lower(): v for k, v in response.headers.items()},
            )
    except urllib.error.HTTPError as exc:
        status, raw, hdrs = exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}
    try:
        return status, json.loads(raw) if raw else None, hdrs
    except ValueError:
        return status, raw.decode(errors="replace"), hdrs
