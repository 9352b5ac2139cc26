"""What a strategy run measures: time-integrated allocation and billing per pool and class,
per-tick series, job waits, drains and SLA violations; and the per-strategy summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from market_pipeline.lab.simulate.pricing import ELASTIC, RIGID


class Meter:
    """Running totals per pool (GPUs now, by class) integrated over time. A pool's areas are
    brought up to date only when the pool changes (and at tick ends): plain Python floats,
    because the event loop touches one pool at a time."""

    def __init__(self, pools: int, ticks: int) -> None:
        self.pools = pools
        self.alloc_now = [[0.0, 0.0] for _ in range(pools)]
        self.bill_now = [[0.0, 0.0] for _ in range(pools)]
        self.used_now = [0.0] * pools  # GPUs' worth of SM time in use (allocated x utilisation)
        self.pending_now = [[0.0, 0.0] for _ in range(pools)]
        self.alloc_area = [[0.0, 0.0] for _ in range(pools)]  # GPU-seconds in the current tick
        self.bill_area = [[0.0, 0.0] for _ in range(pools)]
        self.used_area = [0.0] * pools
        self.last_t = [0.0] * pools
        # latent elastic twins' share of the elastic class (`tenants`, step 5): billed GPUs now
        # and over the tick, so the trace's own elastic tenants can be reported apart
        self.latent_bill_now = [0.0] * pools
        self.latent_bill_area = [0.0] * pools
        self.prices = np.zeros((ticks, 2 * pools))
        self.utilization = np.zeros((ticks, pools))
        self.allocated_by_class = np.zeros((ticks, 2))  # mean GPUs over the tick
        self.pending_by_class = np.zeros((ticks, 2))  # at the tick's start
        self.arrivals = np.zeros(ticks, dtype=np.int64)
        # the rigid guarantee's per-tick record (at the tick's end): rigid jobs waiting, those
        # waiting past their SLA wait, and rigid jobs past it so far (started late since the
        # warm-up, or still waiting)
        self.rigid_waiting = np.zeros(ticks, dtype=np.int64)
        self.rigid_waiting_late = np.zeros(ticks, dtype=np.int64)
        self.rigid_past_sla = np.zeros(ticks, dtype=np.int64)
        self.restart()

    def _advance(self, r: int, t: float) -> None:
        dt = t - self.last_t[r]
        if dt > 0:
            alloc, bill, a_area, b_area = (
                self.alloc_now[r],
                self.bill_now[r],
                self.alloc_area[r],
                self.bill_area[r],
            )
            a_area[0] += alloc[0] * dt
            a_area[1] += alloc[1] * dt
            b_area[0] += bill[0] * dt
            b_area[1] += bill[1] * dt
            self.used_area[r] += self.used_now[r] * dt
            self.latent_bill_area[r] += self.latent_bill_now[r] * dt
            self.last_t[r] = t

    def change(
        self,
        r: int,
        t: float,
        cls: int,
        alloc: float = 0.0,
        bill: float = 0.0,
        used: float = 0.0,
        latent: bool = False,
        bill_pool: int | None = None,
    ) -> None:
        """Pool r's running GPUs of class `cls` change at time t (`latent`: a latent twin's job;
        `bill_pool`: the pool whose price the job pays, when it runs elsewhere)."""
        self._advance(r, t)
        self.alloc_now[r][cls] += alloc
        self.used_now[r] += used
        b = r if bill_pool is None else bill_pool
        if b != r:
            self._advance(b, t)
        self.bill_now[b][cls] += bill
        if latent:
            self.latent_bill_now[b] += bill

    def restart(self) -> None:
        """Zero the run's totals: at the start, and at the end of the warm-up, when everything
        measured so far is forgotten but the running state (jobs on GPUs, queues) and the
        per-tick series' slots are kept."""
        self.revenue_by_class = np.zeros(2)
        self.billed_gpu_hours = np.zeros(2)
        self.revenue_by_pool = np.zeros((self.pools, 2))
        self.billed_by_pool = np.zeros((self.pools, 2))
        self.allocated_gpu_hours = np.zeros(2)
        self.used_gpu_hours = 0.0
        self.cost = 0.0
        self.waits: list[float] = []
        self.wait_class: list[int] = []
        self.drains, self.work_lost_gpu_hours, self.rigid_sla_violations = 0, 0.0, 0
        self.sla_violations_by_gpus: dict[int, int] = {}
        self.sla_violations_by_pool: dict[str, int] = {}
        self.thinning_overflow = 0
        self.latent_revenue, self.latent_billed_gpu_hours = 0.0, 0.0
        self.latent_billed_by_pool = np.zeros(self.pools)

    def pending(self, r: int, cls: int, gpus: float) -> None:
        left = self.pending_now[r][cls] + gpus
        self.pending_now[r][cls] = left if left > 1e-9 else 0.0  # fractional GPUs leave float drift

    def allocated(self) -> np.ndarray:
        return np.array(self.alloc_now)

    def waiting(self) -> np.ndarray:
        return np.array(self.pending_now)

    def close_tick(
        self,
        tick: int,
        t: float,
        seconds: float,
        prices: np.ndarray,
        capacity: np.ndarray,
        unit_cost: np.ndarray,
        serve_cost: np.ndarray,
    ) -> None:
        """Close the tick: revenue at its prices; cost = the powered capacity's fixed part
        (unit - serve cost per GPU-hour, sold or idle) + serve cost per allocated GPU-hour."""
        for r in range(self.pools):
            self._advance(r, t)
        alloc, bill = np.array(self.alloc_area), np.array(self.bill_area)
        self.prices[tick] = prices
        self.revenue_by_pool += bill * prices.reshape(-1, 2) / 3600.0
        self.billed_by_pool += bill / 3600.0
        self.revenue_by_class += (bill * prices.reshape(-1, 2)).sum(axis=0) / 3600.0
        self.billed_gpu_hours += bill.sum(axis=0) / 3600.0
        self.allocated_gpu_hours += alloc.sum(axis=0) / 3600.0
        self.cost += float((alloc.sum(axis=1) * serve_cost).sum()) / 3600.0
        self.cost += float((capacity * (unit_cost - serve_cost)).sum()) * seconds / 3600.0
        self.utilization[tick] = alloc.sum(axis=1) / seconds / np.maximum(capacity, 1e-9)
        self.allocated_by_class[tick] = alloc.sum(axis=0) / seconds
        self.used_gpu_hours += sum(self.used_area) / 3600.0
        latent = np.array(self.latent_bill_area)
        self.latent_revenue += float((latent * prices.reshape(-1, 2)[:, 1]).sum()) / 3600.0
        self.latent_billed_gpu_hours += float(latent.sum()) / 3600.0
        self.latent_billed_by_pool += latent / 3600.0
        self.latent_bill_area = [0.0] * self.pools
        self.alloc_area = [[0.0, 0.0] for _ in range(self.pools)]
        self.bill_area = [[0.0, 0.0] for _ in range(self.pools)]
        self.used_area = [0.0] * self.pools

    def trim(self, ticks: int) -> None:
        """Drop the warm-up's first `ticks` rows of the per-tick series."""
        for name in (
            "prices",
            "utilization",
            "allocated_by_class",
            "pending_by_class",
            "arrivals",
            "rigid_waiting",
            "rigid_waiting_late",
            "rigid_past_sla",
        ):
            setattr(self, name, getattr(self, name)[ticks:])

    def sla_violation(self, num_gpu: int, pool_id: str) -> None:
        self.rigid_sla_violations += 1
        self.sla_violations_by_gpus[num_gpu] = self.sla_violations_by_gpus.get(num_gpu, 0) + 1
        self.sla_violations_by_pool[pool_id] = self.sla_violations_by_pool.get(pool_id, 0) + 1

    def record_wait(self, wait: float, cls: int) -> None:
        self.waits.append(wait)
        self.wait_class.append(cls)


def _percentile(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator > 0 else None


@dataclass
class StrategyResult:
    name: str
    metrics: dict[str, Any]
    series: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.metrics, "extra": self.extra}


def summarize(
    name: str,
    meter: Meter,
    capacity: np.ndarray,
    seconds: float,
    jobs_total: int,
    jobs_started: int,
    jobs_waiting: int,
    extra: dict[str, Any],
) -> StrategyResult:
    waits = np.asarray(meter.waits)
    classes = np.asarray(meter.wait_class)
    revenue = float(meter.revenue_by_class.sum())
    total_capacity_hours = float(capacity.sum()) * seconds / 3600.0
    metrics = {
        "revenue": revenue,
        "profit": revenue - meter.cost,
        "gpu_utilization": float(meter.allocated_gpu_hours.sum()) / total_capacity_hours,
        "gpu_utilization_used": meter.used_gpu_hours / total_capacity_hours,
        "wait_p50_s": _percentile(waits, 50),
        "wait_p99_s": _percentile(waits, 99),
        "elastic_cost_per_gpu_hour": _ratio(meter.revenue_by_class[ELASTIC], meter.billed_gpu_hours[ELASTIC]),
        # the trace's own elastic tenants (without the latent twins, who buy nothing at list
        # price): the like-for-like comparison with static pricing
        "trace_elastic_cost_per_gpu_hour": _ratio(
            meter.revenue_by_class[ELASTIC] - meter.latent_revenue,
            meter.billed_gpu_hours[ELASTIC] - meter.latent_billed_gpu_hours,
        ),
        "latent_elastic_revenue": float(meter.latent_revenue),
        "latent_elastic_gpu_hours": float(meter.latent_billed_gpu_hours),
        "rigid_cost_per_gpu_hour": _ratio(meter.revenue_by_class[RIGID], meter.billed_gpu_hours[RIGID]),
        "drains": int(meter.drains),
        "work_lost_gpu_hours": float(meter.work_lost_gpu_hours),
        "rigid_sla_violations": int(meter.rigid_sla_violations),
        "rigid_wait_p99_s": _percentile(waits[classes == RIGID], 99),
        "elastic_wait_p99_s": _percentile(waits[classes == ELASTIC], 99),
        "elastic_gpu_hours": float(meter.allocated_gpu_hours[ELASTIC]),
        "rigid_gpu_hours": float(meter.allocated_gpu_hours[RIGID]),
        "cost": float(meter.cost),
        "jobs_arrived": int(jobs_total),
        "jobs_started": int(jobs_started),
        "jobs_waiting_at_end": int(jobs_waiting),
        "rigid_waiting_at_end": int(meter.rigid_waiting[-1]) if meter.rigid_waiting.size else 0,
    }
    series = {
        "prices": meter.prices,
        "utilization": meter.utilization,
        "allocated_by_class": meter.allocated_by_class,
        "pending_by_class": meter.pending_by_class,
        "arrivals": meter.arrivals,
        "rigid_waiting": meter.rigid_waiting,
        "rigid_waiting_late": meter.rigid_waiting_late,
        "rigid_past_sla": meter.rigid_past_sla,
    }
    extra = {
        **extra,
        "rigid_gpu_hours_by_pool": meter.billed_by_pool[:, RIGID].tolist(),
        "rigid_revenue_by_pool": meter.revenue_by_pool[:, RIGID].tolist(),
        # the elastic class's billed GPU-hours per pool, all and the trace's own tenants (the
        # latent twins left out): the basket at which static's posted prices are read where
        # static pricing sold no drainable GPU-hour (`guarantee_bench.elastic_cost_ratio`)
        "elastic_gpu_hours_by_pool": meter.billed_by_pool[:, ELASTIC].tolist(),
        "trace_elastic_gpu_hours_by_pool": np.maximum(
            meter.billed_by_pool[:, ELASTIC] - meter.latent_billed_by_pool, 0.0
        ).tolist(),
    }
    if meter.sla_violations_by_gpus:
        extra = {
            **extra,
            "rigid_sla_violations_by_gpus": dict(sorted(meter.sla_violations_by_gpus.items())),
            "rigid_sla_violations_by_pool": dict(sorted(meter.sla_violations_by_pool.items())),
        }
    if meter.thinning_overflow:
        extra = {**extra, "thinning_overflow_cells": meter.thinning_overflow}
    return StrategyResult(name, metrics, series, extra)
