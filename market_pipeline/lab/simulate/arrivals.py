"""Job arrivals: a Poisson stream per (tenant, pool) whose intensity follows the load index
and the tenant's demand at the posted prices, sampled with common random numbers.

By Little's law a tenant that wants d GPUs in a pool, with jobs of mean size x runtime
E[gL] GPU-hours, submits d / E[gL] jobs an hour; each job is a pod of the tenant drawn
(with replacement) with the chance calibration gave it in that pool. Every strategy sees the same
candidate stream (drawn at the demand of the lowest reachable prices, from a generator
seeded by (seed, tick)) and keeps a candidate with probability d(p) / d(p_floor): the
thinning of a Poisson process, so each strategy's arrivals are exactly Poisson at its own
demand, and differences between strategies come from prices, not from sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from market_pipeline.lab.simulate.inputs import PodTable
from market_pipeline.lab.simulate.tenants import TenantModel


@dataclass(frozen=True)
class Candidates:
    """Candidate arrivals of one tick, sorted by time."""

    time: np.ndarray  # seconds since the start
    tenant: np.ndarray
    pool: np.ndarray
    pod: np.ndarray
    u: np.ndarray  # uniform for the thinning

    @property
    def size(self) -> int:
        return int(self.time.size)

    def keep(self, mask: np.ndarray) -> "Candidates":
        return Candidates(self.time[mask], self.tenant[mask], self.pool[mask], self.pod[mask], self.u[mask])


def _rates_per_hour(model: TenantModel, demand: np.ndarray) -> np.ndarray:
    safe = np.where(model.mean_gpu_hours > 0, model.mean_gpu_hours, np.inf)
    return demand / safe


def candidates(
    model: TenantModel, floor_demand: np.ndarray, t0: float, seconds: float, seed: int, tick: int
) -> Candidates:
    """Arrivals over [t0, t0 + seconds) at the floor demand (T, R GPUs, load index applied).
    The trace's tenants and the latent twins draw from separate generators, so adding latent
    demand leaves the trace tenants' stream (and the static run) unchanged."""
    latent = model.latent_mask
    rates = _rates_per_hour(model, floor_demand) * seconds / 3600.0
    parts = [
        _draw(np.random.default_rng([seed, 7919, tick]), model, rates, np.flatnonzero(~latent), t0, seconds)
    ]
    if latent.any():
        parts.append(
            _draw(
                np.random.default_rng([seed, 7927, tick]), model, rates, np.flatnonzero(latent), t0, seconds
            )
        )
    time, tenant, pool, pods, u = (np.concatenate([p[i] for p in parts]) for i in range(5))
    order = np.argsort(time, kind="stable")
    return Candidates(time[order], tenant[order], pool[order], pods[order], u[order])


def _draw(
    rng: np.random.Generator,
    model: TenantModel,
    rates: np.ndarray,
    rows: np.ndarray,
    t0: float,
    seconds: float,
) -> tuple[np.ndarray, ...]:
    """Poisson counts per (tenant, pool) cell of tenants `rows`, then per arrival a time, a
    pod (by the cell's chances) and the thinning uniform."""
    counts = rng.poisson(rates[rows])
    total = int(counts.sum())
    local, pool = np.nonzero(counts)
    per_cell = counts[local, pool]
    tenant = np.repeat(rows[local], per_cell)
    pool = np.repeat(pool, per_cell)
    times = t0 + rng.random(total) * seconds
    pick = rng.random(total)
    pods = np.empty(total, dtype=np.int64)
    start = 0
    for j, r, n in zip(rows[local], *np.nonzero(counts)[1:], per_cell):
        cell_rows, chance = model.pods_by_cell[j][r], model.cell_weights[j][r]
        slot = np.searchsorted(np.cumsum(chance), pick[start : start + n], side="right")
        pods[start : start + n] = cell_rows[np.minimum(slot, cell_rows.size - 1)]
        start += n
    u = rng.random(total)
    return times, tenant, pool, pods, u


def buy_ratio(demand: np.ndarray, floor_demand: np.ndarray) -> np.ndarray:
    """(T, R) demand / floor demand per cell: a candidate with uniform u buys iff u < ratio
    (its reservation price is met), so the ratio is the share of the floor stream bought."""
    return np.where(floor_demand > 0, demand / np.where(floor_demand > 0, floor_demand, 1.0), 0.0)


def thin(cands: Candidates, demand: np.ndarray, floor_demand: np.ndarray) -> tuple[Candidates, int]:
    """Keep each candidate with probability demand / floor demand of its cell; also return
    how many cells wanted more than the floor (the ratio is then capped at 1)."""
    kept, _, overflow = split(cands, buy_ratio(demand, floor_demand))
    return kept, overflow


def split(cands: Candidates, ratio: np.ndarray) -> tuple[Candidates, Candidates, int]:
    """The candidates that buy at `ratio` (see `buy_ratio`), those that do not, and how many
    cells wanted more than the floor."""
    overflow = int((ratio > 1.0 + 1e-9).sum())
    keep = cands.u < ratio[cands.tenant, cands.pool]
    return cands.keep(keep), cands.keep(~keep), overflow


@dataclass(frozen=True)
class InitialJobs:
    tenant: np.ndarray
    pool: np.ndarray
    pod: np.ndarray
    remaining_s: np.ndarray


def initial_population(model: TenantModel, pods: PodTable, demand: np.ndarray, seed: int) -> InitialJobs:
    """Jobs already running at time 0 in the steady state of `demand` (T, R GPUs): per cell
    Poisson(d / E[gL] * E[L]) jobs, each a pod drawn with probability proportional to its
    chance times its runtime (length-biased, as a snapshot of a queue sees them) with a
    uniform share of its runtime left. Order: rigid jobs first (guaranteed work holds its
    GPUs; elastic work would have been drained for it), in a random order within a class.

    The draw is coupled across demands (common random numbers, as `candidates`/`thin` couple
    the arrivals): each cell draws from its own generators, seeded by (seed, tenant, pool), its
    job count by the inverse Poisson CDF of one uniform and its jobs as a fixed sequence of
    (pod, time left, order key) of which it takes the first count. Two runs whose demand for a
    cell differs a little (one strategy's prices against another's) then hold the same jobs
    there but for the few the count adds or removes, instead of two unrelated samples: the
    jobs running at time 0 carry weeks of work (openb's LS jobs run for months), so unrelated
    samples would make the strategies' comparison mostly a comparison of their snapshots."""
    tenants, pools, chosen, remaining, keys = [], [], [], [], []
    rates = _rates_per_hour(model, demand)
    for j in range(model.size):
        for r, rows in enumerate(model.pods_by_cell[j]):
            if rows.size == 0 or rates[j, r] <= 0:
                continue
            biased = model.cell_weights[j][r] * pods.runtime_s[rows]
            expected = rates[j, r] * biased.sum() / 3600.0
            u = np.random.default_rng([seed, 104729, j, r]).random()
            n = max(int(stats.poisson.ppf(u, expected)), 0)
            if n == 0:
                continue
            # prefix-consistent streams: the first n draws do not depend on n
            pick = rows[
                np.random.default_rng([seed, 104729, j, r, 1]).choice(
                    rows.size, size=n, p=biased / biased.sum()
                )
            ]
            tenants.append(np.full(n, j))
            pools.append(np.full(n, r))
            chosen.append(pick)
            left = np.random.default_rng([seed, 104729, j, r, 2]).random(n)
            remaining.append(np.maximum(left * pods.runtime_s[pick], 1.0))
            keys.append(np.random.default_rng([seed, 104729, j, r, 3]).random(n))
    if not chosen:
        empty = np.zeros(0, dtype=np.int64)
        return InitialJobs(empty, empty, empty, np.zeros(0))
    tenant = np.concatenate(tenants)
    order = np.lexsort((np.concatenate(keys), model.elastic[tenant]))  # rigid (False) first, by key
    return InitialJobs(
        tenant[order],
        np.concatenate(pools)[order],
        np.concatenate(chosen)[order],
        np.concatenate(remaining)[order],
    )
