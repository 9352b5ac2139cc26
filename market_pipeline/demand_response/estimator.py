"""The demand-response estimator: a fixed-effects log-log regression per pool x class.

    log demand_t = -e * log price_t + hour-of-day bin + calendar day [+ b * log load_t] + noise

In a live loop the price leans into the load (busy hours are priced higher), so a fit of
demand on price alone reads "price up, demand up" and gets even the sign of `e` wrong. The
hour-of-day fixed effects take out the load's daily shape; one fixed effect per calendar day
takes out the day of week and that day's load level at once (a proxy for the level, such as
the previous day's mean demand, carries the past prices' own effect and biases the fit
toward zero; the day's effect does not). A `load` column, where the caller knows the load the
price leaned into (the forecast), controls for the level within the day too. What is left of
the price is what the loop did not lean on: the bounded price experiments' dither
(`experiments`).

The interval is 80% by default: cluster-robust by day (CR1) with at least `MIN_CLUSTERS`
days, heteroskedasticity-robust (HC1) otherwise, Student t quantiles. With a prior (the
configured claims' elasticity, `prior=(mean, sd)`) the fit is combined with it by precision:
the loop then prices with the claims until the experiments have spoken, and moves to the
data as they do. The CLI (`market-pipeline demand fit`), the refit asset and the simulator
all call `fit_elasticity`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

DAY_SECONDS = 86_400.0
HOUR_BIN_CHOICES = (24, 12, 8, 6, 4, 3, 2, 1)
MIN_PER_BIN = 6  # observations per time-of-day bin before a finer bin is used
MIN_CLUSTERS = 8  # days before the interval is clustered by day
MIN_STD_ERROR = 1e-9
MIN_PRICE_SPREAD = 1e-4  # residual log-price std below which the price says nothing


class DemandResponseInputError(ValueError):
    """Input to the demand-response fit is invalid; the message names the problem."""


@dataclass(frozen=True)
class ResponseFit:
    """One pool x class: the elasticity (positive: demand falls as the price rises), its
    interval, and how it was obtained."""

    pool_id: str
    resource_class: str
    elasticity: float | None
    elasticity_low: float | None
    elasticity_high: float | None
    observations: int
    std_error: float | None = None
    method: str = "fe-ols"  # "fe-ols", "fe-ols+prior", "prior" (the data do not identify it) or "none"
    hour_bins: int = 0
    price_spread: float = 0.0  # residual std of log price after the controls: the experiments' signal
    r2: float | None = None
    clusters: int = 0
    reason: str = ""
    data_std_error: float | None = None  # the data's own standard error (before any prior)
    data_elasticity: float | None = None  # the data's own estimate (before any prior)

    @property
    def key(self) -> str:
        return f"{self.pool_id}/{self.resource_class}"

    @property
    def width(self) -> float:
        if self.elasticity_low is None or self.elasticity_high is None:
            return math.inf
        return self.elasticity_high - self.elasticity_low

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def fit_elasticity(
    ts_seconds: np.ndarray,
    price: np.ndarray,
    demand: np.ndarray,
    *,
    pool_id: str = "",
    resource_class: str = "",
    load: np.ndarray | None = None,
    prior: tuple[float, float] | None = None,
    level: float = 0.8,
) -> ResponseFit:
    """Fit one pool x class. `ts_seconds` are UTC epoch seconds; rows with a non-positive or
    non-finite price or demand carry no log and are left out (counted out of `observations`)."""
    ts = np.asarray(ts_seconds, dtype=np.float64)
    p, d = np.asarray(price, dtype=np.float64), np.asarray(demand, dtype=np.float64)
    if not (ts.shape == p.shape == d.shape) or ts.ndim != 1:
        raise DemandResponseInputError("ts, price and demand must be 1-D arrays of one length")
    if not 0 < level < 1:
        raise DemandResponseInputError(f"interval level must be in (0, 1), got {level}")
    order = np.argsort(ts, kind="stable")
    ts, p, d = ts[order], p[order], d[order]
    lv = None if load is None else np.asarray(load, dtype=np.float64)[order]
    usable = np.isfinite(ts) & np.isfinite(p) & np.isfinite(d) & (p > 0) & (d > 0)
    if lv is not None:
        usable &= np.isfinite(lv) & (lv > 0)
    keep = usable
    ts, x, y = ts[keep], np.log(p[keep]), np.log(d[keep])
    level_col = None if lv is None else np.log(lv[keep])
    return _regress(ts, x, y, level_col, pool_id, resource_class, prior, level)


def _design(ts: np.ndarray, level_col: np.ndarray | None) -> tuple[np.ndarray, int, np.ndarray]:
    """Controls: intercept, time-of-day bins, calendar days (so days of week), the load."""
    n = ts.size
    hour = np.floor((ts % DAY_SECONDS) / 3600.0).astype(np.int64)
    bins = next((b for b in HOUR_BIN_CHOICES if n >= MIN_PER_BIN * b), 1)  # 4-5 rows: one bin
    hour_bin = hour * bins // 24
    day = np.floor(ts / DAY_SECONDS).astype(np.int64)
    cols = [np.ones(n)]
    cols += [(hour_bin == b).astype(float) for b in np.unique(hour_bin)[1:]]
    cols += [(day == c).astype(float) for c in np.unique(day)[1:]]
    if level_col is not None and np.ptp(level_col) > 1e-9:
        cols.append(level_col - level_col.mean())
    return np.column_stack(cols), bins, day


def _regress(
    ts: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    level_col: np.ndarray | None,
    pool_id: str,
    resource_class: str,
    prior: tuple[float, float] | None,
    level: float,
) -> ResponseFit:
    n = ts.size
    base = {"pool_id": pool_id, "resource_class": resource_class, "observations": int(n)}
    if n < 4:
        return _prior_only(base, prior, level, f"{n} usable observations (need at least 4)")
    controls, bins, day = _design(ts, level_col)
    # Frisch-Waugh: the price's and demand's residuals on the controls carry the elasticity.
    coef_x, *_ = np.linalg.lstsq(controls, x, rcond=None)
    coef_y, *_ = np.linalg.lstsq(controls, y, rcond=None)
    rx, ry = x - controls @ coef_x, y - controls @ coef_y
    rank = int(np.linalg.matrix_rank(controls))
    dof = n - rank - 1
    spread = float(np.sqrt(np.mean(rx * rx)))
    if dof < 2 or spread < MIN_PRICE_SPREAD:
        why = (
            f"the price barely varies once the calendar and load are held fixed (residual log-price std "
            f"{spread:.1e})"
            if dof >= 2
            else f"{n} observations for {rank + 1} parameters"
        )
        return _prior_only({**base, "hour_bins": bins, "price_spread": spread}, prior, level, why)
    sxx = float(rx @ rx)
    slope = float(rx @ ry) / sxx
    resid = ry - slope * rx
    clusters = np.unique(day)
    if clusters.size >= MIN_CLUSTERS:  # CR1 by day: a day's errors move together
        scores = np.array([float(rx[day == c] @ resid[day == c]) for c in clusters])
        g = clusters.size
        var = (g / (g - 1)) * ((n - 1) / (n - rank - 1)) * float(scores @ scores) / sxx**2
        t_dof = g - 1
    else:  # HC1
        var = (n / dof) * float((rx * rx) @ (resid * resid)) / sxx**2
        t_dof = dof
    se = math.sqrt(max(var, 0.0))
    if se < MIN_STD_ERROR:  # residuals vanish: as many controls as rows, not a measurement
        return _prior_only(
            {**base, "hour_bins": bins, "price_spread": spread},
            prior,
            level,
            f"a perfect fit: {n} observations leave no residual to measure the error",
        )
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / total if total > 0 else None
    fit = {
        **base,
        "hour_bins": bins,
        "price_spread": spread,
        "r2": r2,
        "clusters": int(clusters.size) if clusters.size >= MIN_CLUSTERS else 0,
    }
    estimate = -slope  # elasticity: demand falls as the price rises
    if prior is not None:
        mean, sd = _check_prior(prior)
        w_data, w_prior = 1.0 / max(se, 1e-12) ** 2, 1.0 / sd**2
        post = (estimate * w_data + mean * w_prior) / (w_data + w_prior)
        post_se = math.sqrt(1.0 / (w_data + w_prior))
        z = float(stats.norm.ppf(0.5 + level / 2))
        return ResponseFit(
            **fit,
            elasticity=post,
            elasticity_low=post - z * post_se,
            elasticity_high=post + z * post_se,
            std_error=post_se,
            method="fe-ols+prior",
            data_std_error=se,
            data_elasticity=estimate,
        )
    t = float(stats.t.ppf(0.5 + level / 2, t_dof))
    return ResponseFit(
        **fit,
        elasticity=estimate,
        elasticity_low=estimate - t * se,
        elasticity_high=estimate + t * se,
        std_error=se,
        method="fe-ols",
        data_std_error=se,
        data_elasticity=estimate,
    )


def _check_prior(prior: tuple[float, float]) -> tuple[float, float]:
    mean, sd = float(prior[0]), float(prior[1])
    if not (math.isfinite(mean) and math.isfinite(sd) and sd > 0):
        raise DemandResponseInputError(f"prior must be a finite (mean, sd > 0), got {prior!r}")
    return mean, sd


def _prior_only(base: dict, prior: tuple[float, float] | None, level: float, why: str) -> ResponseFit:
    if prior is None:
        return ResponseFit(
            **base, elasticity=None, elasticity_low=None, elasticity_high=None, method="none", reason=why
        )
    mean, sd = _check_prior(prior)
    z = float(stats.norm.ppf(0.5 + level / 2))
    return ResponseFit(
        **base,
        elasticity=mean,
        elasticity_low=mean - z * sd,
        elasticity_high=mean + z * sd,
        std_error=sd,
        method="prior",
        reason=why,
    )
