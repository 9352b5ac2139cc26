"""`/metrics` in the Prometheus text format (prometheus-client), read from the warehouse at
scrape time (through the gate's cache: a scrape while nothing changed opens nothing).

Families (all prefixed `mp_`): published prices, the guarantee's reach per pool, certificate margins, the latest solve's
status and seconds, the latest tick's time and latency (and its p95 over 100 ticks), promise breaches of the latest tick, decisions
and drain outcomes by reason, telemetry quarantine per source, GPU and pool utilisation, and
the webhook jobs by state. A family whose table the warehouse does not hold yet is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timezone

import numpy as np
from fastapi import APIRouter, Request, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from market_pipeline.service.context import ServiceContext
from market_pipeline.tick import Promises, guarantee_reach
from market_pipeline.warehouse import WarehouseError
from market_pipeline.warehouse import service_readers as readers
from market_pipeline.warehouse.readers import guarantee_backing_by_pool

log = logging.getLogger(__name__)
router = APIRouter()
EPS = 1e-9
LATEST = datetime(9999, 1, 1, tzinfo=timezone.utc)  # every snapshot is before it


def _ts(value: object) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float("nan")  # type: ignore[union-attr]


class WarehouseCollector:
    def __init__(self, context: ServiceContext) -> None:
        self.context = context

    def collect(self) -> Iterator[Metric]:
        for family in (
            self._market,
            self._ticks,
            self._solve,
            self._decisions,
            self._telemetry,
            self._gpus,
            self._webhooks,
        ):
            try:
                yield from family()
            except WarehouseError as exc:  # a table not built yet: that family waits
                log.info("metrics: %s skipped (%s)", family.__name__, " ".join(str(exc).split())[:160])

    def _market(self) -> Iterator[Metric]:
        wh, promises = self.context.warehouse, Promises.from_config(self.context.config)
        price = GaugeMetricFamily(
            "mp_price_per_gpu_hour", "Published price in force", labels=["pool", "resource_class"]
        )
        for row in readers.prices_now(wh).iter_rows(named=True):
            price.add_metric([row["pool_id"], row["resource_class"]], row["price"])
        yield price
        reach = GaugeMetricFamily(
            "mp_guarantee_reach",
            "Share of the guaranteed premium the pool's guarantee backs, from the latest snapshot "
            "(1: no guaranteed work waits; 0: it waits with no drainable work to drain for it)",
            labels=["pool"],
        )
        for pool, (drainable, waiting) in sorted(guarantee_backing_by_pool(wh, LATEST).items()):
            reach.add_metric([pool], guarantee_reach(drainable, waiting))
        yield reach
        ticks = readers.tick_reasons(wh, None, limit=6 * max(1, len(self.context.config.pools)))
        if ticks.is_empty():
            return
        last_at = ticks["tick_at"].max()
        latest = ticks.filter(ticks["tick_at"] == last_at)
        before = ticks.filter(ticks["tick_at"] < last_at)
        margin = GaugeMetricFamily("mp_certificate_margin", "Backlog certificate margin", labels=["pool"])
        certified = GaugeMetricFamily(
            "mp_pool_certified", "1 if the pool's certificate holds", labels=["pool"]
        )
        breach = GaugeMetricFamily(
            "mp_promise_breaches",
            "Promises the latest tick's prices break (0 = kept)",
            labels=["pool", "promise"],
        )
        full = readers.latest_ticks(wh)
        lists = {r["pool_id"]: r["list_price"] for r in full.iter_rows(named=True)}
        for row in latest.iter_rows(named=True):
            pool = row["pool_id"]
            margin.add_metric([pool], row["margin"])
            certified.add_metric([pool], 1.0 if row["certified"] else 0.0)
            g, d = row["guaranteed"], row["drainable"]
            over_cap = promises.over_cap(np.array([g]), np.array([lists.get(pool, g)]))[0]
            breach.add_metric([pool, "guaranteed_cap"], 1.0 if over_cap else 0.0)
            discount = 1 - d / g if g > 0 else 0.0
            band = promises.discount_min - EPS <= discount <= promises.discount_max + EPS
            breach.add_metric([pool, "drainable_band"], 0.0 if band else 1.0)
            prev = before.filter(before["pool_id"] == pool).tail(1)
            step_ok = True
            if prev.height:
                for cls in ("guaranteed", "drainable"):
                    old = prev[cls][0]
                    if old > 0 and promises.over_step(np.array([row[cls]]), np.array([old]))[0]:
                        step_ok = False
            breach.add_metric([pool, "max_price_step"], 0.0 if step_ok else 1.0)
        yield margin
        yield certified
        yield breach
        tick = GaugeMetricFamily("mp_last_tick_timestamp_seconds", "Time of the latest market tick")
        tick.add_metric([], _ts(last_at))
        yield tick

    def _ticks(self) -> Iterator[Metric]:
        frame = readers.tick_latencies(self.context.warehouse)
        if frame.is_empty():
            return
        latest = GaugeMetricFamily(
            "mp_tick_latency_seconds", "Wall seconds from the latest tick's run start to its prices published"
        )
        latest.add_metric([], float(frame["tick_seconds"][0]))
        yield latest
        values = sorted(float(v) for v in frame["tick_seconds"])
        p95 = GaugeMetricFamily(
            "mp_tick_latency_p95_seconds", "95th percentile of the tick latency over the last 100 ticks"
        )
        p95.add_metric([], values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))])
        yield p95

    def _solve(self) -> Iterator[Metric]:
        solve = readers.latest_solve(self.context.warehouse)
        if solve is None:
            return
        status = GaugeMetricFamily("mp_solve_status", "1 for the latest solve's status", labels=["status"])
        status.add_metric([str(solve["status"])], 1.0)
        yield status
        seconds = GaugeMetricFamily("mp_solve_seconds", "Seconds the latest solve took")
        seconds.add_metric([], float(solve["seconds"] or 0.0))
        yield seconds
        fallback = GaugeMetricFamily("mp_solve_fallback", "1 if the latest solve fell back")
        fallback.add_metric([], 1.0 if solve["fallback_reason"] else 0.0)
        yield fallback

    def _decisions(self) -> Iterator[Metric]:
        wh = self.context.warehouse
        decisions = CounterMetricFamily(
            "mp_decisions",
            "Live decisions by kind, allowed, outcome and reason",
            labels=["kind", "allowed", "outcome", "reason"],
        )
        for row in readers.decision_counts(wh).iter_rows(named=True):
            decisions.add_metric(
                [row["kind"], str(bool(row["allowed"])).lower(), row["outcome"], row["reason"]], row["n"]
            )
        yield decisions
        drains = CounterMetricFamily(
            "mp_drain_outcomes", "Finished drains by outcome and reason", labels=["outcome", "reason"]
        )
        for row in readers.drain_outcome_counts(wh).iter_rows(named=True):
            drains.add_metric([row["outcome"], row["reason"]], row["n"])
        yield drains

    def _telemetry(self) -> Iterator[Metric]:
        frame = readers.telemetry_quarantine(self.context.warehouse)
        rate = GaugeMetricFamily(
            "mp_telemetry_quarantine_ratio",
            "Quarantined / rows in, latest ingest per source",
            labels=["source"],
        )
        last = GaugeMetricFamily(
            "mp_telemetry_last_ingest_timestamp_seconds", "When each source last ingested", labels=["source"]
        )
        for row in frame.iter_rows(named=True):
            rows_in = row["rows_in"] or 0
            rate.add_metric([row["source"]], (row["quarantined"] or 0) / rows_in if rows_in else 0.0)
            last.add_metric([row["source"]], _ts(row["ingested_at"]))
        yield rate
        yield last

    def _gpus(self) -> Iterator[Metric]:
        wh = self.context.warehouse
        sm = GaugeMetricFamily(
            "mp_gpu_sm_util_pct",
            "SM utilisation per GPU (latest telemetry hour, mean)",
            labels=["pool", "node", "gpu"],
        )
        mem = GaugeMetricFamily(
            "mp_gpu_memory_used_pct",
            "Memory watermark per GPU (latest telemetry hour, peak)",
            labels=["pool", "node", "gpu"],
        )
        per_pool: dict[str, list[float]] = {}
        for row in readers.gpu_utilisation(wh).iter_rows(named=True):
            labels = [row["pool_id"], row["node_id"], row["gpu_uuid"]]
            sm.add_metric(labels, row["sm_util_pct"])
            mem.add_metric(labels, row["mem_used_pct"] or 0.0)
            per_pool.setdefault(row["pool_id"], []).append(row["sm_util_pct"])
        yield sm
        yield mem
        pool_sm = GaugeMetricFamily("mp_pool_sm_util_pct", "Mean SM utilisation per pool", labels=["pool"])
        for pool, values in sorted(per_pool.items()):
            pool_sm.add_metric([pool], sum(values) / len(values))
        yield pool_sm
        snapshots = readers.pool_snapshots(wh, None, limit=max(1, len(self.context.config.pools)))
        alloc = GaugeMetricFamily(
            "mp_pool_gpu_utilisation",
            "Running GPUs / powered GPUs per pool (latest snapshot)",
            labels=["pool"],
        )
        for row in snapshots.iter_rows(named=True):
            alloc.add_metric([row["pool_id"]], row["utilisation"])
        yield alloc

    def _webhooks(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("mp_webhook_jobs", "Drain-warning webhook jobs by state", labels=["state"])
        for state, n in self.context.store.job_counts():
            jobs.add_metric([state], n)
        yield jobs


def registry_for(context: ServiceContext) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WarehouseCollector(context))
    return registry


@router.get("/metrics", include_in_schema=False)
def scrape(request: Request) -> Response:
    app = request.app
    if not hasattr(app.state, "registry"):
        app.state.registry = registry_for(app.state.context)
    return Response(generate_latest(app.state.registry), media_type=CONTENT_TYPE_LATEST)
