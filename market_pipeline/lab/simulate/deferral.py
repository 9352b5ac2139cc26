"""Time shifting: elastic work that a tick's price turns away waits instead of leaving.

Elastic tenants (drain tolerant, delay insensitive: batch training, sweeps, offline
inference) use the off-peak low price; the backlog certificate (`tick.certificate`) models the
same work as a floor that waits instead of leaving. Each candidate arrival carries a
uniform u and buys at a tick iff u < d(p)/d(p_floor) for its (tenant, pool) cell
(`arrivals.buy_ratio`): u is its reservation price expressed on the demand curve. A rigid
candidate that does not buy is lost. An elastic one enters its tenant's backlog and is
submitted, at the start of the first later tick whose price it accepts (same u, that tick's
ratio), if that comes within `patience_s` of its arrival; else it expires (lost).

The rule is the same for every strategy. Under a constant price nothing deferred is ever
accepted later (static pricing loses exactly what it lost before); a price that dips below
the arrival's price serves the deferred work then, and fills the dip's idle capacity.
"""

from __future__ import annotations

import numpy as np

from market_pipeline.lab.simulate.arrivals import Candidates


class DeferredDemand:
    def __init__(self, elastic: np.ndarray, patience_s: float) -> None:
        self.elastic = np.asarray(elastic, dtype=bool)  # (T,) tenant is elastic
        self.patience_s = float(patience_s)
        self._empty()
        self.deferred = 0  # candidates that entered the backlog
        self.released = 0  # ... and were submitted later
        self.expired = 0  # ... and gave up
        self.delays: list[np.ndarray] = []  # seconds from first arrival to submission

    def _empty(self) -> None:
        z = np.zeros(0, dtype=np.int64)
        self.time, self.tenant, self.pool, self.pod, self.u = np.zeros(0), z, z, z, np.zeros(0)

    @property
    def enabled(self) -> bool:
        return self.patience_s > 0

    @property
    def size(self) -> int:
        return int(self.time.size)

    def add(self, turned_away: Candidates) -> None:
        """Keep the elastic candidates that did not buy (rigid ones are lost)."""
        if not self.enabled or turned_away.size == 0:
            return
        mine = self.elastic[turned_away.tenant]
        if not mine.any():
            return
        self.time = np.concatenate([self.time, turned_away.time[mine]])
        self.tenant = np.concatenate([self.tenant, turned_away.tenant[mine]])
        self.pool = np.concatenate([self.pool, turned_away.pool[mine]])
        self.pod = np.concatenate([self.pod, turned_away.pod[mine]])
        self.u = np.concatenate([self.u, turned_away.u[mine]])
        self.deferred += int(mine.sum())

    def release(self, ratio: np.ndarray, now_s: float) -> Candidates:
        """Drop what waited longer than the patience; return (oldest first) what buys at
        `ratio` now, with its first arrival time (the caller submits it at `now_s`)."""
        if self.size == 0:
            return _none()
        alive = now_s - self.time <= self.patience_s
        self.expired += int((~alive).sum())
        buy = alive & (self.u < ratio[self.tenant, self.pool])
        out = Candidates(self.time[buy], self.tenant[buy], self.pool[buy], self.pod[buy], self.u[buy])
        if buy.any():
            self.released += out.size
            self.delays.append(now_s - out.time)
        stay = alive & ~buy
        self.time, self.tenant, self.pool, self.pod, self.u = (
            self.time[stay],
            self.tenant[stay],
            self.pool[stay],
            self.pod[stay],
            self.u[stay],
        )
        return out

    def summary(self) -> dict[str, float | int | None]:
        delays = np.concatenate(self.delays) if self.delays else np.zeros(0)
        return {
            "elastic_deferred": self.deferred,
            "elastic_deferred_served": self.released,
            "elastic_deferred_expired": self.expired,
            "elastic_deferred_waiting_at_end": self.size,
            "elastic_deferral_p50_h": float(np.median(delays)) / 3600.0 if delays.size else None,
            "elastic_deferral_mean_h": float(delays.mean()) / 3600.0 if delays.size else None,
        }


def _none() -> Candidates:
    z = np.zeros(0, dtype=np.int64)
    return Candidates(np.zeros(0), z, z, z, np.zeros(0))
