"""The simulated jobs of one strategy run, column-wise in Python lists (appends are cheap and
the event loop touches one job at a time)."""

from __future__ import annotations

import math

from market_pipeline.placement.capacity import Placement

QUEUED, RUNNING, DRAINING, DONE = 0, 1, 2, 3


class Jobs:
    def __init__(self) -> None:
        self.tenant: list[int] = []
        self.pool: list[int] = []  # where it runs / waits
        self.bill_pool: list[int] = []  # whose posted price it pays: the pool it bought in
        self.pod: list[int] = []
        self.cls: list[int] = []  # RIGID / ELASTIC
        self.gpus: list[float] = []
        self.arrival: list[float] = []
        self.first_start: list[float] = []
        self.run_start: list[float] = []
        self.remaining: list[float] = []  # seconds of work left when (re)started
        self.placement: list[Placement | None] = []
        self.state: list[int] = []
        self.epoch: list[int] = []  # bumps on every start/stop: stale finish events are skipped
        self.awaiting_drain: list[bool] = []
        self.drains: list[int] = []

    def __len__(self) -> int:
        return len(self.tenant)

    def add(
        self, tenant: int, pool: int, pod: int, cls: int, gpus: float, arrival: float, remaining: float
    ) -> int:
        self.tenant.append(tenant)
        self.pool.append(pool)
        self.bill_pool.append(pool)
        self.pod.append(pod)
        self.cls.append(cls)
        self.gpus.append(gpus)
        self.arrival.append(arrival)
        self.first_start.append(math.nan)
        self.run_start.append(math.nan)
        self.remaining.append(remaining)
        self.placement.append(None)
        self.state.append(QUEUED)
        self.epoch.append(0)
        self.awaiting_drain.append(False)
        self.drains.append(0)
        return len(self.tenant) - 1

    def task_id(self, job: int) -> str:
        return f"sim-job-{job}"
