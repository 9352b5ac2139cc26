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

Elastic work that a high price turns away may wait and buy at a later, lower price (elastic
tenants move their work to the off-peak low price). Then an hour's demand answers the prices
of the hours before it too, and the hour-to-hour dither overstates how far demand falls under
a price that stays up. With `lag_hours` > 0 the fit is a distributed lag:

    log demand_t = -e_now * log price_t + g * mean(log price over the lag window) + controls

and the elasticity is the long-run one, e = e_now - g: the response to a price held over the
window and beyond, which is what a tick's price level meets. With an independent dither the
lag mean's coefficient measures the deferred work that comes back within the window; the
interval widens by about sqrt(1 + lag steps) for it. That price is paid only where the data
show deferral: the lag stays in the fit when a robust Wald test rejects it at
`STRUCTURE_ALPHA` over the terms tested, and the fit says which it used (`lag_hours`).

Tenants answer the price differently over the day (off-peak batch work is the most
price-sensitive). With `daily_cycle` the price now also enters times cos and sin of the
hour of day, so the elasticity is e(h) = e + a cos(2 pi h / 24) + b sin(2 pi h / 24): `elasticity`
is its daily mean and (a, b) the cycle (`elasticity_cos`, `elasticity_sin`), each combined with
a prior of mean 0 and the prior's sd; it is kept only where the data show one (the same test as
the lag's, on a and b jointly), and the hour's cos and sin are controls of their own.

The time-of-day effects are as fine as the data's slots allow (5 minutes at 5-minute steps):
a load that moves within the hour, which the price leans into, would otherwise be read as a
lag and a cycle. The interval is 80% by default: the cluster jackknife by day (CV3) with at
least `MIN_CLUSTERS` days, Newey-West otherwise, Student t quantiles. With a prior (the
configured claims' elasticity, `prior=(mean, sd)`) the fit is combined with it by precision:
the loop then prices with the claims until the experiments have spoken, and moves to the
data as they do. The CLI (`market-pipeline demand fit`), the refit asset and the simulator
all call `fit_elasticity`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy import sparse, stats
from scipy.sparse import csgraph

DAY_SECONDS = 86_400.0
TIME_OF_DAY_BINS = (288, 144, 96, 48, 24, 12, 8, 6, 4, 3, 2, 1)  # 5 minutes ... a day
MIN_PER_BIN = 6  # observations per time-of-day bin before a finer bin is used
ABSORB_MAX_ITER, ABSORB_TOL = 500, 1e-12  # alternating projections of the fixed effects
HAC_MIN_HOURS = 2.0  # the Newey-West window (short histories) spans at least this much time
MIN_CLUSTERS = 8  # days before the interval is clustered by day
MIN_STD_ERROR = 1e-9
MIN_PRICE_SPREAD = 1e-4  # residual log-price std below which the price says nothing
# the share of histories with neither a lag nor a daily cycle where the fit keeps one anyway
# (split evenly over the terms tested); chosen on tuning seeds of the synthetic benchmark and
# judged on others (`structure_benchmark`, docs/history/demand_response_tuning.md)
STRUCTURE_ALPHA = 0.10


DATA_METHODS = ("fe-ols", "fe-ols+prior")  # fits the data spoke in


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
    # the low end of the prices the fit used (their (1 - level) / 2 quantile): down to there
    # the data speak for the curve
    price_low: float | None = None

    def at_hour(self, hour: float) -> float | None:
        """The elasticity at an hour of the day (UTC), never below 0."""
        if self.elasticity is None:
            return None
        return elasticity_at_hour(self.elasticity, self.elasticity_cos, self.elasticity_sin, hour)

    def observed_at(self, hour: float, bound: str = "lower_bound") -> tuple[float, float] | None:
        """(the low end of the observed prices, the elasticity at the hour on the daily cycle:
        its interval's lower bound, or with `bound` "central" its estimate): what the tick may
        take the data to show of spend below its prices (`tick.response.observed_budget`);
        None where the data did not speak (no rows, or the prior alone)."""
        e = self.elasticity if bound == "central" else self.elasticity_low
        if self.price_low is None or e is None or self.method not in DATA_METHODS:
            return None
        return self.price_low, elasticity_at_hour(e, self.elasticity_cos, self.elasticity_sin, hour)

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
    structure_alpha: float = STRUCTURE_ALPHA,
) -> ResponseFit:
    """Fit one pool x class. `ts_seconds` are UTC epoch seconds; rows with a non-positive or
    non-finite price or demand carry no log and are left out (counted out of `observations`),
    and so are rows with no earlier row inside the lag window while the lag is tested.

    `lag_hours` > 0 and `daily_cycle` ask for the two optional terms. Each is tested in the
    model that has both (the lag by its coefficient, the cycle by its two jointly), against
    the F distribution of a Wald statistic under the fit's robust covariance, at
    `structure_alpha` / (number of terms tested): with both asked, a history with neither is
    given one in at most `structure_alpha` of cases. A term that fails is dropped and the fit is
    made again without it. `structure_alpha` 1 keeps every asked term."""
    ts = np.asarray(ts_seconds, dtype=np.float64)
    p, d = np.asarray(price, dtype=np.float64), np.asarray(demand, dtype=np.float64)
    if not (ts.shape == p.shape == d.shape) or ts.ndim != 1:
        raise DemandResponseInputError("ts, price and demand must be 1-D arrays of one length")
    if not 0 < level < 1:
        raise DemandResponseInputError(f"interval level must be in (0, 1), got {level}")
    if not (math.isfinite(lag_hours) and lag_hours >= 0):
        raise DemandResponseInputError(f"lag_hours must be a finite number >= 0, got {lag_hours}")
    if not (math.isfinite(structure_alpha) and 0 < structure_alpha <= 1):
        raise DemandResponseInputError(f"structure_alpha must be in (0, 1], got {structure_alpha}")
    if prior is not None:
        _check_prior(prior)
    order = np.argsort(ts, kind="stable")
    ts, p, d = ts[order], p[order], d[order]
    lv = None if load is None else np.asarray(load, dtype=np.float64)[order]
    usable = np.isfinite(ts) & np.isfinite(p) & np.isfinite(d) & (p > 0) & (d > 0)
    if lv is not None:
        usable &= np.isfinite(lv) & (lv > 0)
    ts, x, y = ts[usable], np.log(p[usable]), np.log(d[usable])
    level_col = None if lv is None else np.log(lv[usable])
    base = {"pool_id": pool_id, "resource_class": resource_class}

    def fit_with(lag: bool, cycle: bool) -> _Ols | ResponseFit:
        rows = np.ones(ts.size, dtype=bool)
        lagged = None
        if lag:
            lagged, rows = lagged_mean(ts, x, lag_hours * 3600.0)
            lagged = lagged[rows]
        lc = None if level_col is None else level_col[rows]
        return _ols(ts[rows], x[rows], y[rows], lc, lagged, cycle, base, prior, level)

    want_lag, want_cycle = lag_hours > 0, daily_cycle
    full = fit_with(want_lag, want_cycle)
    if isinstance(full, _Ols) and (want_lag or want_cycle):
        tested = int(want_lag) + int(want_cycle)
        threshold = structure_alpha / tested
        keep_lag = want_lag and (structure_alpha >= 1 or full.p_value([1]) < threshold)
        cycle_cols = [full.k - 2, full.k - 1]
        keep_cycle = want_cycle and (structure_alpha >= 1 or full.p_value(cycle_cols) < threshold)
        if (keep_lag, keep_cycle) != (want_lag, want_cycle):
            full = fit_with(keep_lag, keep_cycle)
    elif not isinstance(full, _Ols) and want_lag:  # too few rows for the lag: the price now only
        full = fit_with(False, want_cycle)
    fit = (
        full
        if not isinstance(full, _Ols)
        else full.to_fit(base, prior, level, lag_hours if full.lag else 0.0)
    )
    # the low end of the observed prices at the interval's level: a tail the fit hardly saw
    # (the experiments' last dither below) does not yet speak for the curve there
    return replace(fit, price_low=float(np.exp(np.quantile(x, (1 - level) / 2)))) if x.size else fit


def lagged_mean(ts: np.ndarray, x: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row (ts sorted), the mean of x over the rows in [ts - window_s, ts), and whether
    there is one."""
    csum = np.concatenate([[0.0], np.cumsum(x)])
    first = np.searchsorted(ts, ts - window_s, side="left")
    last = np.searchsorted(ts, ts, side="left")  # rows strictly before
    count = last - first
    mean = np.divide(csum[last] - csum[first], count, out=np.zeros_like(x), where=count > 0)
    return mean, count > 0


def time_of_day_bins(ts: np.ndarray) -> int:
    """Bins per day for the time-of-day effects: the finest of `TIME_OF_DAY_BINS` with at least
    `MIN_PER_BIN` rows each and no finer than the data's own slots (hourly data: 24 at most;
    5-minute data: down to 5 minutes). A load shape that moves within the hour is a confounder
    at 5-minute steps: the price leans into it, and hour bins leave its within-hour slope in the
    residual, where the lag (a smooth function of time) and the cycle read it as structure."""
    slots = np.unique(np.round(ts % DAY_SECONDS)).size
    n = ts.size
    return next((b for b in TIME_OF_DAY_BINS if b <= slots and n >= MIN_PER_BIN * b), 1)


def _absorb(
    ts: np.ndarray, level_col: np.ndarray | None, cycle: bool, data: np.ndarray, bins: int | None = None
) -> tuple[np.ndarray, int, int, np.ndarray]:
    """The columns of `data` net of the controls: time-of-day bins, calendar days (so days of
    week), the load, and (`cycle`) the hour's cos and sin themselves, so that the cycle's columns
    (price x cos, price x sin) are identified from the price's variation only, not from the time
    of day. The two sets of fixed effects are swept out by alternating projections (exact in one
    pass where every day has every bin), the few dense controls by least squares. Returns the
    residuals, the bins per day, the controls' rank and the calendar day of each row."""
    tod = ts % DAY_SECONDS
    bins = time_of_day_bins(ts) if bins is None else bins
    tod_bin = np.minimum(np.floor(tod * bins / DAY_SECONDS).astype(np.int64), bins - 1)
    day = np.floor(ts / DAY_SECONDS).astype(np.int64)
    groups = [np.unique(g, return_inverse=True)[1] for g in (tod_bin, day)]
    dense = []
    if level_col is not None and np.ptp(level_col) > 1e-9:
        dense.append(level_col)
    if cycle:
        angle = 2 * np.pi * tod / DAY_SECONDS
        dense += [np.cos(angle), np.sin(angle)]
    m = np.column_stack([data, *dense]) if dense else np.array(data, dtype=np.float64, copy=True)
    m = m - m.mean(axis=0)
    counts = [np.bincount(g).astype(np.float64) for g in groups]
    scale = max(float(np.abs(m).max()), 1e-300)
    for _ in range(ABSORB_MAX_ITER):
        moved = 0.0
        for g, c in zip(groups, counts, strict=True):
            means = (
                np.column_stack([np.bincount(g, weights=col, minlength=c.size) for col in m.T]) / c[:, None]
            )
            m -= means[g]
            moved = max(moved, float(np.abs(means).max()))
        if moved <= ABSORB_TOL * scale:
            break
    fe_rank = int(sum(c.size for c in counts) - _components(*groups))
    k = data.shape[1]
    if not dense:
        return m, bins, fe_rank, day
    d = m[:, k:]
    coef, _, dense_rank, _ = np.linalg.lstsq(d, m[:, :k], rcond=None)
    return m[:, :k] - d @ coef, bins, fe_rank + int(dense_rank), day


def _components(a: np.ndarray, b: np.ndarray) -> int:
    """Connected components of the bipartite graph of time-of-day bins and days (one per set of
    fixed effects that share a level; 1 where the days overlap in their bins)."""
    na, nb = int(a.max()) + 1, int(b.max()) + 1
    graph = sparse.coo_matrix((np.ones(a.size), (a, na + b)), shape=(na + nb, na + nb))
    return int(csgraph.connected_components(graph, directed=False)[0])


@dataclass(frozen=True)
class _Ols:
    """One regression's estimates and robust covariance (the columns: price now, [lag], [cycle])."""

    slopes: np.ndarray
    cov: np.ndarray
    t_dof: int
    lag: bool
    cycle: bool
    observations: int
    hour_bins: int
    price_spread: float
    r2: float | None
    clusters: int

    @property
    def k(self) -> int:
        return int(self.slopes.size)

    def p_value(self, cols: list[int]) -> float:
        """The Wald test that these coefficients are all 0, F(q, t_dof) under the robust covariance."""
        b = self.slopes[cols]
        v = self.cov[np.ix_(cols, cols)]
        try:
            wald = float(b @ np.linalg.solve(v, b))
        except np.linalg.LinAlgError:
            return 1.0
        if not math.isfinite(wald) or wald < 0:
            return 1.0
        return float(stats.f.sf(wald / len(cols), len(cols), max(self.t_dof, 1)))

    def to_fit(
        self, base: dict, prior: tuple[float, float] | None, level: float, lag_hours: float
    ) -> ResponseFit:
        k = self.k
        level_k = k - 2 if self.cycle else k  # the columns whose sum is the daily-mean response
        contrast = np.zeros(k)
        contrast[:level_k] = 1.0  # the long-run slope: the sum of the price now and the lag
        estimate = -float(contrast @ self.slopes)  # elasticity: demand falls as the price rises
        se = math.sqrt(max(float(contrast @ self.cov @ contrast), 0.0))
        fit: dict = {
            **base,
            "observations": self.observations,
            "hour_bins": self.hour_bins,
            "price_spread": self.price_spread,
            "r2": self.r2,
            "clusters": self.clusters,
            "lag_hours": lag_hours,
        }
        if self.cycle:
            fit["elasticity_cos"], fit["elasticity_sin"] = (
                _shrunk(-float(self.slopes[c]), float(self.cov[c, c]), prior) for c in (k - 2, k - 1)
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
        t = float(stats.t.ppf(0.5 + level / 2, self.t_dof))
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


def _ols(
    ts: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    level_col: np.ndarray | None,
    lagged: np.ndarray | None,
    cycle: bool,
    base: dict,
    prior: tuple[float, float] | None,
    level: float,
) -> _Ols | ResponseFit:
    """The regression of log demand on the price columns (now, [the lag's mean], [price x cos,
    price x sin of the hour]) and the controls; a prior-only (or empty) fit where the data
    cannot identify it."""
    n = ts.size
    base = {**base, "observations": int(n)}
    if n < 4:
        return _prior_only(base, prior, level, f"{n} usable observations (need at least 4)")
    columns = [x] if lagged is None else [x, lagged]
    if cycle:
        angle = 2 * np.pi * (ts % DAY_SECONDS) / DAY_SECONDS
        columns += [x * np.cos(angle), x * np.sin(angle)]
    prices = np.column_stack(columns)
    k = prices.shape[1]
    # Frisch-Waugh: the price's and demand's residuals on the controls carry the elasticity.
    resid_all, bins, rank, day = _absorb(ts, level_col, cycle, np.column_stack([prices, y]))
    rx, ry = resid_all[:, :k], resid_all[:, k]
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
    clusters = np.unique(day)
    if clusters.size >= MIN_CLUSTERS:  # the jackknife by day (CV3): a day's errors move together
        data = np.column_stack([prices, y])
        cov = _day_jackknife(ts, level_col, cycle, data, bins, day, slopes)
        t_dof = clusters.size - 1
    else:  # Newey-West (Bartlett): 5-minute residuals move together over the hour and beyond
        cov = (n / dof) * (bread @ _newey_west_meat(ts, rx * resid[:, None]) @ bread)
        t_dof = dof
    contrast = np.zeros(k)
    contrast[: k - 2 if cycle else k] = 1.0
    if math.sqrt(max(float(contrast @ cov @ contrast), 0.0)) < MIN_STD_ERROR:
        # residuals vanish: as many controls as rows, not a measurement
        return _prior_only(
            {**base, "hour_bins": bins, "price_spread": spread},
            prior,
            level,
            f"a perfect fit: {n} observations leave no residual to measure the error",
        )
    total = float(((y - y.mean()) ** 2).sum())
    return _Ols(
        slopes=slopes,
        cov=cov,
        t_dof=int(t_dof),
        lag=lagged is not None,
        cycle=cycle,
        observations=int(n),
        hour_bins=bins,
        price_spread=spread,
        r2=1.0 - float(resid @ resid) / total if total > 0 else None,
        clusters=int(clusters.size) if clusters.size >= MIN_CLUSTERS else 0,
    )


def _day_jackknife(
    ts: np.ndarray,
    level_col: np.ndarray | None,
    cycle: bool,
    data: np.ndarray,
    bins: int,
    day: np.ndarray,
    slopes: np.ndarray,
) -> np.ndarray:
    """The cluster jackknife (CV3): (G - 1) / G times the spread around the full fit of the
    slopes fitted with one day left out at a time, the controls (time-of-day effects included)
    estimated again without that day. With 14 days of 5-minute rows the sandwich by day (CR1)
    read the error about 15-20% small: each time-of-day effect is a mean over the same 14 days,
    so every day's residuals share the others' noise (`bench demand-structure`)."""
    k = slopes.size
    days = np.unique(day)
    g = days.size
    dev = np.zeros((g, k))
    for i, d in enumerate(days):
        keep = day != d
        lc = None if level_col is None else level_col[keep]
        resid, _, _, _ = _absorb(ts[keep], lc, cycle, data[keep], bins)
        rx, ry = resid[:, :k], resid[:, k]
        xtx = rx.T @ rx
        if np.linalg.cond(xtx) > 1e10:  # one day carries all of a column's variation
            return np.full((k, k), np.inf)
        dev[i] = np.linalg.solve(xtx, rx.T @ ry) - slopes
    return (g - 1) / g * (dev.T @ dev)


def _newey_west_meat(ts: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The HAC meat sum_l w_l (S_t' S_{t-l} + S_{t-l}' S_t) with Bartlett weights, over a
    bandwidth of the usual rule 4 (n/100)^(2/9) rows or `HAC_MIN_HOURS` of rows, the larger."""
    n = scores.shape[0]
    step = float(np.median(np.diff(ts))) if n > 1 else 3600.0
    rows_per_window = int(math.ceil(HAC_MIN_HOURS * 3600.0 / max(step, 1.0)))
    bandwidth = min(n - 1, max(int(4 * (n / 100) ** (2 / 9)), rows_per_window))
    meat = scores.T @ scores
    for lag in range(1, bandwidth + 1):
        w = 1.0 - lag / (bandwidth + 1)
        gamma = scores[lag:].T @ scores[:-lag]
        meat += w * (gamma + gamma.T)
    return meat


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
