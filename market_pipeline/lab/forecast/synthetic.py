"""Seeded synthetic demand that looks like a GPU cluster's (for benchmarks and tests).

Jobs arrive as a Poisson process whose rate follows a daily cycle (and, where a pool has a
varying price, falls with price), each asks for 1-16 GPUs and runs a heavy-tailed time;
demand is the GPUs requested by jobs alive at each step, like running + pending in Helios.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

JOB_SIZES = np.array([1, 2, 4, 8, 16])
JOB_SIZE_WEIGHTS = np.array([0.35, 0.2, 0.2, 0.2, 0.05])
DEFAULT_START = dt.datetime(2026, 1, 5)


def job_demand(
    rng: np.random.Generator,
    steps: int,
    *,
    step_minutes: int = 5,
    mean_gpus: float = 60.0,
    price: np.ndarray | None = None,
    elasticity: float = 1.5,
) -> np.ndarray:
    """GPUs requested per step by a synthetic job stream (integer counts, as floats)."""
    per_day = 1440 // step_minutes
    phase = 2 * np.pi * (np.arange(steps) % per_day) / per_day
    daily = 1.0 + 0.5 * np.sin(phase - np.pi / 2) + 0.15 * np.sin(2 * phase)
    mean_duration_steps = 12 * 60 // step_minutes  # 12 h mean, heavy tail
    mean_size = float(JOB_SIZES @ JOB_SIZE_WEIGHTS)
    rate = daily * mean_gpus / (mean_size * mean_duration_steps)
    if price is not None:
        rate = rate * (price / np.mean(price)) ** (-elasticity)
    arrivals = rng.poisson(rate)
    # Jobs already running when the window opens start at step 0 like everyone else.
    arrivals[0] += rng.poisson(mean_gpus / mean_size)
    starts = np.repeat(np.arange(steps), arrivals)
    durations = np.ceil(rng.pareto(1.8, starts.size) * mean_duration_steps * 0.8).astype(int) + 1
    sizes = rng.choice(JOB_SIZES, size=starts.size, p=JOB_SIZE_WEIGHTS)
    change = np.zeros(steps + 1)
    np.add.at(change, starts, sizes)
    np.add.at(change, np.minimum(starts + durations, steps), -sizes)
    return np.cumsum(change)[:steps]


def stepped_price(
    rng: np.random.Generator, steps: int, *, base: float = 2.0, change_every: int = 36
) -> np.ndarray:
    """A price that moves by up to +-25% every `change_every` steps, then holds."""
    moves = rng.uniform(-0.25, 0.25, steps // change_every + 1)
    levels = base * np.exp(np.cumsum(moves) - np.cumsum(moves).mean())
    return np.repeat(levels, change_every)[:steps]


def synthetic_demand_table(
    pools: int,
    *,
    days: float = 3.0,
    step_minutes: int = 5,
    seed: int = 0,
    priced_share: float = 0.3,
    start: dt.datetime = DEFAULT_START,
) -> pl.DataFrame:
    """Long table (pool_id, ts, demand, price) for `pools` pools of `days` of history."""
    rng = np.random.default_rng(seed)
    steps = int(days * 1440 // step_minutes)
    stamps = [start + dt.timedelta(minutes=step_minutes * i) for i in range(steps)]
    pool_ids, demands, prices = [], [], []
    for index in range(pools):
        priced = rng.random() < priced_share
        price = stepped_price(rng, steps) if priced else np.full(steps, 2.0)
        mean_gpus = float(rng.choice([8.0, 30.0, 60.0, 150.0, 400.0]))
        demands.append(
            job_demand(
                rng, steps, step_minutes=step_minutes, mean_gpus=mean_gpus, price=price if priced else None
            )
        )
        prices.append(price)
        pool_ids.append(f"pool-{index:04d}")
    return pl.DataFrame(
        {
            "pool_id": np.repeat(pool_ids, steps),
            "ts": pl.Series(stamps * pools, dtype=pl.Datetime("us")),
            "demand": np.concatenate(demands),
            "price": np.concatenate(prices),
        }
    )
