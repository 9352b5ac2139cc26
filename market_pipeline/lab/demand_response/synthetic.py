"""Synthetic (price, demand) histories with a known constant elasticity, priced the way a live
loop prices: the price leans into the load it expects (the calendar's shape and yesterday's
level), plus a bounded randomised dither. Demand then answers the published price with the
true elasticity, times noise the price never saw. A fit that ignores the calendar reads the
lean as a positive slope; the estimator must recover the truth from the dither."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import polars as pl

START = datetime(2026, 3, 2, tzinfo=timezone.utc)  # a Monday


def load_shape(hours: np.ndarray) -> np.ndarray:
    """Diurnal load shape (mean 1): a daytime peak, a quiet night, quieter weekends."""
    hod = hours % 24
    dow = (hours // 24) % 7
    daily = 1.0 + 0.35 * np.sin(2 * np.pi * (hod - 9) / 24) + 0.1 * np.sin(4 * np.pi * hod / 24)
    return daily * np.where(dow >= 5, 0.8, 1.05)


@dataclass(frozen=True)
class HistoryParams:
    """What a synthetic history is drawn from: its truth, how the loop priced it, and which
    series and draw it is. These defaults are an hourly meter's history (`synthetic_history`).

    `elasticity`: the (daily-mean) elasticity demand answers the price with; `cycle` (a, b): at
    hour h it is elasticity + a cos(2 pi h / 24) + b sin(...). `lean`: how far the price leans
    into the load the loop expects; `dither`: the +- share of its random sign; `noise`: the sd of
    demand's log noise. `base_price` and `base_demand`: the price and demand at the mean load."""

    elasticity: float
    days: int = 14
    step_minutes: int = 60
    lean: float = 0.6
    dither: float = 0.05
    noise: float = 0.05
    cycle: tuple[float, float] = (0.0, 0.0)
    base_price: float = 2.0
    base_demand: float = 100.0
    pool_id: str = "A100@synthetic"
    resource_class: str = "drainable"
    seed: int = 0


@dataclass(frozen=True)
class StructuredParams(HistoryParams):
    """A structure-benchmark history (`structured_history`): 5-minute steps, the price leaning
    10% of the load's swing with a +-6% dither held `dither_hold` steps, a lag term
    `lag_coefficient` and AR(1) noise of coefficient `noise_ar`."""

    step_minutes: int = 5
    lean: float = 0.1
    dither: float = 0.06
    lag_coefficient: float = 0.0
    dither_hold: int = 1
    noise_ar: float = 0.0


def synthetic_history(params: HistoryParams) -> pl.DataFrame:
    """Rows `ts, pool_id, resource_class, price, demand` (ts UTC, one per `step_minutes`): the
    price leans into the expected load as a power `lean` of it, the load shape steps each hour."""
    p = params
    rng = np.random.default_rng(p.seed)
    cal = _calendar(rng, p.days, p.step_minutes, hourly=True)
    steps = cal.hours.size
    signs = rng.choice([-1.0, 1.0], size=steps)
    price = p.base_price * cal.expected**p.lean * (1.0 + p.dither * signs)
    demand = (
        p.base_demand
        * cal.shape
        * cal.level
        * (price / p.base_price) ** (-hourly_elasticity(p.elasticity, p.cycle, cal.hours))
        * np.exp(rng.normal(0.0, p.noise, steps))
    )
    return _frame(cal.hours, price, demand, p.pool_id, p.resource_class)


@dataclass(frozen=True)
class _Calendar:
    """The load a history's loop meets, one entry per step."""

    hours: np.ndarray  # since START
    shape: np.ndarray  # the load shape
    level: np.ndarray  # the day's level, a random walk
    expected: np.ndarray  # what the loop expects: the load shape times yesterday's level


def _calendar(rng: np.random.Generator, days: int, step_minutes: int, *, hourly: bool) -> _Calendar:
    """The calendar of `days` in steps of `step_minutes`; `hourly`: the load shape steps each
    hour (an hourly meter), else it moves within the hour too (a 5-minute meter)."""
    hours = np.arange(days * 24 * 60 // step_minutes) * step_minutes / 60.0
    day = (hours // 24).astype(int)
    level = np.exp(np.cumsum(rng.normal(0.0, 0.08, days)))
    shape = load_shape(np.floor(hours) if hourly else hours)
    return _Calendar(hours, shape, level[day], shape * np.concatenate([[1.0], level[:-1]])[day])


def hourly_elasticity(elasticity: float, cycle: tuple[float, float], hours: np.ndarray) -> np.ndarray:
    angle = 2 * np.pi * (hours % 24) / 24
    return elasticity + cycle[0] * np.cos(angle) + cycle[1] * np.sin(angle)


def deferred_history(
    elasticity: float,
    *,
    days: int = 28,
    patience_hours: int = 24,
    dither: float = 0.05,
    noise: float = 0.03,
    seed: int = 0,
) -> pl.DataFrame:
    """Hourly rows as `synthetic_history`'s, where the work a price turns away waits and buys at
    the first later hour whose price it accepts (within `patience_hours`), as elastic work
    does (it waits for a cheaper hour rather than leave). Each hour's arrivals carry reservation quantiles u; one buys at
    price p iff u < (p / floor)^-e. Under a price held constant nothing deferred ever buys,
    so the long-run elasticity is `elasticity`; the hour-to-hour dither reads far more."""
    rng = np.random.default_rng(seed)
    hours = np.arange(days * 24, dtype=np.float64)
    arrivals = 100.0 * load_shape(hours)
    price = 2.0 * load_shape(hours) ** 0.5 * (1.0 + dither * rng.choice([-1.0, 1.0], hours.size))
    accepts = np.minimum((price / 1.0) ** -elasticity, 1.0)  # floor price 1.0: a share of arrivals
    quantiles = (np.arange(400) + 0.5) / 400
    waiting: list[tuple[int, np.ndarray]] = []  # (arrival hour, its waiting quantiles)
    demand = np.zeros(hours.size)
    for t in range(hours.size):
        bought = (quantiles < accepts[t]).mean() * arrivals[t]
        still = []
        for s, u in waiting:
            if t - s > patience_hours:
                continue
            buys = u < accepts[t]
            bought += buys.sum() * arrivals[s] / quantiles.size
            still.append((s, u[~buys]))
        waiting = [(s, u) for s, u in still if u.size] + [(t, quantiles[quantiles >= accepts[t]])]
        demand[t] = bought * np.exp(rng.normal(0.0, noise))
    return _frame(hours, price, demand, "A100@synthetic", "drainable")


def _frame(
    hours: np.ndarray, price: np.ndarray, demand: np.ndarray, pool_id: str, resource_class: str
) -> pl.DataFrame:
    ts = [START.timestamp() + h * 3600.0 for h in hours]
    return pl.DataFrame(
        {
            "ts": pl.Series(
                [datetime.fromtimestamp(t, tz=timezone.utc) for t in ts], dtype=pl.Datetime("us", "UTC")
            ),
            "pool_id": pool_id,
            "resource_class": resource_class,
            "price": price,
            "demand": demand,
        }
    )


# --- histories for the structure benchmark: known lag and daily cycle, or neither ---------------

STRUCTURE_LAG_HOURS = 3.0  # the deferral window of the structured histories (the loop's lag window)


def structured_history(params: StructuredParams) -> pl.DataFrame:
    """A history whose truth is the estimator's model with known terms. The price leans into the
    load the loop expects (the load shape, moving within the hour, times yesterday's level) by `lean` of its swing,
    times a +-`dither` sign held for `dither_hold` steps. Demand is

        log d_t = log load_t - e_now(h) log(p_t / p0) + g mean(log(p / p0) over the last 3 h) + u_t

    with e_now(h) = e + g + a cos(2 pi h / 24) + b sin(...): the long-run daily-mean elasticity
    is `elasticity` (e), `lag_coefficient` (g > 0: work a high price turned away comes back
    within the window), `cycle` (a, b). u is AR(1) with coefficient `noise_ar` and sd `noise`."""
    p = params
    rng = np.random.default_rng(p.seed)
    cal = _calendar(rng, p.days, p.step_minutes, hourly=False)
    hours, steps = cal.hours, cal.hours.size
    signs = rng.choice([-1.0, 1.0], size=-(-steps // p.dither_hold)).repeat(p.dither_hold)[:steps]
    price = p.base_price * (1.0 + p.lean * (cal.expected - 1.0)) * (1.0 + p.dither * signs)
    x = np.log(price / p.base_price)
    window = int(round(STRUCTURE_LAG_HOURS * 60 / p.step_minutes))
    csum = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(steps)
    first = np.maximum(idx - window, 0)
    lag_mean = np.divide(csum[idx] - csum[first], idx - first, out=np.zeros(steps), where=idx > first)
    e_now = hourly_elasticity(p.elasticity + p.lag_coefficient, p.cycle, hours)
    shocks = rng.normal(0.0, p.noise * np.sqrt(1.0 - p.noise_ar**2), steps)
    u = np.empty(steps)
    u[0] = rng.normal(0.0, p.noise)
    for t in range(1, steps):
        u[t] = p.noise_ar * u[t - 1] + shocks[t]
    demand = p.base_demand * cal.shape * cal.level * np.exp(-e_now * x + p.lag_coefficient * lag_mean + u)
    return _frame(hours, price, demand, p.pool_id, p.resource_class)


def structure_case(seed: int, structured: bool) -> dict:
    """One benchmark history's truth, drawn from `seed`: the elasticity (0.3..2.5), the dither's
    hold (5 minutes, 15 minutes or an hour), the noise's autocorrelation (0..0.8) and, where
    `structured`, a lag coefficient of 0.3..0.6 e and a cycle of amplitude 0.3..0.5 e."""
    rng = np.random.default_rng([seed, 7])
    e = float(rng.uniform(0.3, 2.5))
    case = {
        "seed": seed,
        "structured": structured,
        "elasticity": e,
        "lag_coefficient": 0.0,
        "cycle": (0.0, 0.0),
        "dither_hold": int(rng.choice([1, 3, 12])),
        "noise_ar": float(rng.uniform(0.0, 0.8)),
    }
    lag_share, amplitude, phase = rng.uniform(0.3, 0.6), rng.uniform(0.3, 0.5), rng.uniform(0, 2 * np.pi)
    if structured:
        case["lag_coefficient"] = float(lag_share * e)
        case["cycle"] = (float(amplitude * e * np.cos(phase)), float(amplitude * e * np.sin(phase)))
    return case


def constant_elasticity_panel(
    seed: int = 0, elasticities: tuple[float, ...] = (0.35, 1.6, 0.8, 2.4), days: int = 14
) -> pl.DataFrame:
    """Several pool x class series of 5-minute steps with constant elasticities and no lag or
    cycle, the price leaning into the smooth load by 10% of its swing with a +-6% dither, 5%
    demand noise (the shape of issue 40's reproduction)."""
    return pl.concat(
        [
            structured_history(StructuredParams(e, days=days, pool_id=f"P{i}@synthetic", seed=seed * 100 + i))
            for i, e in enumerate(elasticities)
        ]
    )
