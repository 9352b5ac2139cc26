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

Elastic work that a high price turns away may wait and buy at a later, lower price (seed 000
§2.3: elastic tenants "use the off-peak low price"). Then an hour's demand answers the prices
of the hours before it too, and the hour-to-hour dither overstates how far demand falls under
a price that stays up. With `lag_hours` > 0 the fit is a distributed lag:

    log demand_t = -e_now * log price_t + g * mean(log price over the lag window) + controls

and the elasticity is the long-run one, e = e_now - g: the response to a price held over the
window and beyond, which is what a tick's price level meets. With an independent dither the
lag mean's coefficient measures the deferred work that comes back within the window; the
interval widens by about sqrt(1 + lag steps) for it. That price is paid only where the data
show deferral: the lag stays in the fit when its coefficient is significant at 90%
(`LAG_KEEP_Z`), and the fit says which it used (`lag_hours`).

Tenants answer the price differently over the day (seed 000 §5.2: off-peak batch work is the
most price-sensitive). With `daily_cycle` the price now also enters times cos and sin of the
hour of day, so the elasticity is e(h) = e + a cos(2 pi h / 24) + b sin(2 pi h / 24): `elasticity`
is its daily mean and (a, b) the cycle (`elasticity_cos`, `elasticity_sin`), each combined with
a prior of mean 0 and the prior's sd (no cycle until the data show one).

The interval is 80% by default: cluster-robust by day (CR1) with at least `MIN_CLUSTERS`
days, heteroskedasticity-robust (HC1) otherwise, Student t quantiles. With a prior (the
configured claims' elasticity, `prior=(mean, sd)`) the fit is combined with it by precision:
the loop then prices with the claims until the experiments have spoken, and moves to the
data as they do. The CLI (`market-pipeline demand fit`), the refit asset and the simulator
all call `fit_elasticity`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy import stats

DAY_SECONDS = 86_400.0
HOUR_BIN_CHOICES = (24, 12, 8, 6, 4, 3, 2, 1)
MIN_PER_BIN = 6  # observations per time-of-day bin before a finer bin is used
MIN_CLUSTERS = 8  # days before the interval is clustered by day
MIN_STD_ERROR = 1e-9
MIN_PRICE_SPREAD = 1e-4  # residual log-price std below which the price says nothing
# the lag's |coefficient / se| from which the data show deferral (90%, two-sided); chosen on the
# job-level tuning points among 1.0, 1.645 and 2.576 (docs/demand_response.md)
LAG_KEEP_Z = 1.645


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
    lag_hours: float = 0.0  # the distributed lag's window in this fit (0: the price now only)
    elasticity_cos: float = 0.0  # the daily cycle: e(h) = e + cos_ * cos(2 pi h / 24) + sin_ * sin(...)
    elasticity_sin: float = 0.0

    def at_hour(self, hour: float) -> float | None:
        """The elasticity at an hour of the day (UTC), never below 0."""
        if self.elasticity is None:
            return None
        return elasticity_at_hour(self.elasticity, self.elasticity_cos, self.elasticity_sin, hour)

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


def elasticity_at_hour(mean: float, cos_: float, sin_: float, hour: float) -> float:
    """The daily cycle e(h) = mean + cos_ cos(2 pi h / 24) + sin_ sin(2 pi h / 24), never below 0."""
    angle = 2 * math.pi * (hour % 24) / 24
    return max(mean + cos_ * math.cos(angle) + sin_ * math.sin(angle), 0.0)


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
    lag_hours: float = 0.0,
    daily_cycle: bool = False,
    lag_keep_z: float = LAG_KEEP_Z,
) -> ResponseFit:
    """Fit one pool x class. `ts_seconds` are UTC epoch seconds; rows with a non-positive or
    non-finite price or demand carry no log and are left out (counted out of `observations`),
    and so are rows with no earlier row inside the lag window (`lag_hours` > 0). The lag stays
    where its |coefficient / se| >= `lag_keep_z`; 0 keeps it always."""
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
    if not (math.isfinite(lag_hours) and lag_hours >= 0):
        raise DemandResponseInputError(f"lag_hours must be a finite number >= 0, got {lag_hours}")
    if not (math.isfinite(lag_keep_z) and lag_keep_z >= 0):
        raise DemandResponseInputError(f"lag_keep_z must be a finite number >= 0, got {lag_keep_z}")
    ts, x, y = ts[usable], np.log(p[usable]), np.log(d[usable])
    level_col = None if lv is None else np.log(lv[usable])
    if lag_hours > 0:
        lagged, has_lag = lagged_mean(ts, x, lag_hours * 3600.0)
        with_lag = _fit_columns(
            ts[has_lag], x[has_lag], y[has_lag], None if level_col is None else level_col[has_lag],
            lagged[has_lag], pool_id, resource_class, prior, level, daily_cycle, lag_keep_z,
        )  # fmt: skip
        if with_lag is not None and with_lag.method.startswith("fe-ols"):
            return replace(with_lag, lag_hours=lag_hours)
    # no lag asked for, the data show no deferral, or too few rows for it: the price now only
    fit = _fit_columns(ts, x, y, level_col, None, pool_id, resource_class, prior, level, daily_cycle)
    assert fit is not None
    return fit


def _fit_columns(
    ts: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    level_col: np.ndarray | None,
    lagged: np.ndarray | None,
    pool_id: str,
    resource_class: str,
    prior: tuple[float, float] | None,
    level: float,
    daily_cycle: bool,
    lag_keep_z: float = LAG_KEEP_Z,
) -> ResponseFit | None:
    """The price columns (now, the lag, the cycle) and the regression; None: the lag is weak."""
    columns = [x] if lagged is None else [x, lagged]
    if daily_cycle:
        angle = 2 * np.pi * (ts % DAY_SECONDS) / DAY_SECONDS
        columns += [x * np.cos(angle), x * np.sin(angle)]
    args = (y, level_col, pool_id, resource_class, prior, level)
    lag_test = lagged is not None and lag_keep_z > 0
    return _regress(
        ts, np.column_stack(columns), *args, cycle=daily_cycle, lag_test=lag_test, keep_z=lag_keep_z
    )


def lagged_mean(ts: np.ndarray, x: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row (ts sorted), the mean of x over the rows in [ts - window_s, ts), and whether
    there is one."""
    csum = np.concatenate([[0.0], np.cumsum(x)])
    first = np.searchsorted(ts, ts - window_s, side="left")
    last = np.searchsorted(ts, ts, side="left")  # rows strictly before
    count = last - first
    mean = np.divide(csum[last] - csum[first], count, out=np.zeros_like(x), where=count > 0)
    return mean, count > 0


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
    prices: np.ndarray,
    y: np.ndarray,
    level_col: np.ndarray | None,
    pool_id: str,
    resource_class: str,
    prior: tuple[float, float] | None,
    level: float,
    cycle: bool = False,
    lag_test: bool = False,
    keep_z: float = LAG_KEEP_Z,
) -> ResponseFit | None:
    """`prices` (n, k): column 0 the log price now, then any lag, then (`cycle`) the price
    times cos and sin of the hour; the elasticity is minus the sum of the price's and the
    lag's coefficients (the long-run response), the cycle minus the last two. `lag_test`
    (column 1 is the lag): None where the lag's coefficient is not significant."""
    n = ts.size
    k = prices.shape[1]
    level_k = k - 2 if cycle else k  # the columns whose sum is the daily-mean response
    base = {"pool_id": pool_id, "resource_class": resource_class, "observations": int(n)}
    if n < 4:
        return _prior_only(base, prior, level, f"{n} usable observations (need at least 4)")
    controls, bins, day = _design(ts, level_col)
    # Frisch-Waugh: the price's and demand's residuals on the controls carry the elasticity.
    coef_x, *_ = np.linalg.lstsq(controls, prices, rcond=None)
    coef_y, *_ = np.linalg.lstsq(controls, y, rcond=None)
    rx, ry = prices - controls @ coef_x, y - controls @ coef_y
    rank = int(np.linalg.matrix_rank(controls))
    dof = n - rank - k
    spread = float(np.sqrt(np.mean(rx[:, 0] * rx[:, 0])))
    xtx = rx.T @ rx
    if dof < 2 or spread < MIN_PRICE_SPREAD or np.linalg.cond(xtx) > 1e10:
        why = (
            f"{n} observations for {rank + k} parameters"
            if dof < 2
            else f"the price barely varies once the calendar and load are held fixed (residual log-price std "
            f"{spread:.1e})"
        )
        return _prior_only({**base, "hour_bins": bins, "price_spread": spread}, prior, level, why)
    bread = np.linalg.inv(xtx)
    slopes = bread @ (rx.T @ ry)
    resid = ry - rx @ slopes
    contrast = np.zeros(k)
    contrast[:level_k] = 1.0  # the long-run slope: the sum of the price now and the lags
    slope = float(contrast @ slopes)
    clusters = np.unique(day)
    if clusters.size >= MIN_CLUSTERS:  # CR1 by day: a day's errors move together
        scores = np.array([rx[day == c].T @ resid[day == c] for c in clusters])  # (G, k)
        g = clusters.size
        meat = scores.T @ scores
        scale = (g / (g - 1)) * ((n - 1) / (n - rank - k))
        t_dof = g - 1
    else:  # HC1
        meat = (rx * (resid * resid)[:, None]).T @ rx
        scale = n / dof
        t_dof = dof
    cov = scale * (bread @ meat @ bread)
    if lag_test and abs(slopes[1]) < keep_z * math.sqrt(max(cov[1, 1], 0.0)):
        return None
    se = math.sqrt(max(float(contrast @ cov @ contrast), 0.0))
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
    if cycle:
        fit["elasticity_cos"], fit["elasticity_sin"] = (
            _shrunk(-float(slopes[c]), float(cov[c, c]), prior) for c in (k - 2, k - 1)
        )
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


def _shrunk(estimate: float, var: float, prior: tuple[float, float] | None) -> float:
    """A cycle coefficient combined with a prior of mean 0 and the level prior's sd."""
    if prior is None:
        return estimate
    sd = _check_prior(prior)[1]
    return estimate * sd**2 / (sd**2 + max(var, 0.0))


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
