"""The truth grid through the job-level simulator: per truth point, the learning Stackelberg
strategy against static and against a clairvoyant leader that knows the truth.

A truth point (`lab.demand_response.truth.TruthPoint`) sets the tenants' hidden response
(`EconomicAssumptions`: the class elasticities, the +-`tod_swing` over the day, the latent
elastic demand); the tenants keep their +-25% spread around the class elasticity. Every point
runs the same trace, fleet, seed and settings with three strategies:
- static: the list prices;
- stackelberg: the live loop's learning (`simulate.learning`), the claims as the prior;
- clairvoyant: the same tick on the true population, hour by hour, no experiments;
- claims: the same tick on the claims alone, no fit, no experiment (what learning is worth).

Per point: revenue, profit, utilisation, elastic and rigid cost per GPU-hour against static;
the regret (clairvoyant profit - loop profit) / clairvoyant profit over the measured window;
the experiments' cost (true: the truth's expected profit per hour at the tick's own prices
minus at the experiment prices, at the tick's load index, summed over the measured window's
experiment ticks; and the loop's own estimate), both per loop revenue; the elasticity error
at each refit; promise breaches on the published prices.
"""

from __future__ import annotations

import time
from dataclasses import replace
from statistics import median
from typing import Any

import numpy as np

from market_pipeline.lab.demand_response.grid_run import grid_targets
from market_pipeline.lab.demand_response.truth import TruthPoint
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.metrics import StrategyResult
from market_pipeline.lab.simulate.run_inputs import RunInputs
from market_pipeline.lab.simulate.runner import build_inputs, run_strategies
from market_pipeline.lab.simulate.settings import SimulationSettings
from market_pipeline.lab.simulate.tenants import ELASTICITY_FLOOR, best_response
from market_pipeline.tick.promises import Promises

STRATEGIES = ("static", "stackelberg", "clairvoyant", "claims")
COMPARED = ("revenue", "profit", "elastic_cost_per_gpu_hour", "rigid_cost_per_gpu_hour")


def job_grid_points() -> tuple[TruthPoint, ...]:
    """The judged points: a handful across the stated ranges (elastic 0.2-3, rigid 0-0.5), and
    the latent-demand assumption as one labelled point. None is among the aggregate grid's
    tuning points, and no setting was tuned on any of them."""
    return (
        TruthPoint("e0.3/r0.1", 0.3, 0.1),
        TruthPoint("e1/r0", 1.0, 0.0),
        TruthPoint("e2/r0.25", 2.0, 0.25),
        TruthPoint("e3/r0.5", 3.0, 0.5),
        TruthPoint("latent-demand e2/r0.2 ratio1", 2.0, 0.2, latent_ratio=1.0),
    )


def job_tuning_points() -> tuple[TruthPoint, ...]:
    """The points the job-level settings (the lag's keep threshold) were chosen on: none is a
    judged point; two are the aggregate grid's tuning truths (e1.5/r0.4, e2.5/r0.1)."""
    return (
        TruthPoint("tune e0.6/r0.2", 0.6, 0.2),
        TruthPoint("tune e1.5/r0.4", 1.5, 0.4),
        TruthPoint("tune e2.5/r0.1", 2.5, 0.1),
        TruthPoint("tune latent e1.5/r0.3 ratio0.5", 1.5, 0.3, latent_ratio=0.5),
    )


def select_points(spec: str) -> tuple[TruthPoint, ...]:
    """`--points`: "" or "judged" (the judged points), "tuning", or a comma list of names from
    either set; an unknown name raises SimulationInputError."""
    if spec.strip() in ("", "judged"):
        return job_grid_points()
    if spec.strip() == "tuning":
        return job_tuning_points()
    known = {p.name: p for p in (*job_grid_points(), *job_tuning_points())}
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise SimulationInputError(f"--points {unknown}: choose from {sorted(known)}")
    return tuple(known[w] for w in wanted)


def point_settings(base: SimulationSettings, point: TruthPoint) -> SimulationSettings:
    economics = replace(
        base.economics,
        elastic_elasticity=point.elastic,
        rigid_elasticity=point.rigid,
        latent_elastic_ratio=point.latent_ratio,
        elasticity_tod_swing=point.tod_swing,
    )
    return base.with_(strategies=STRATEGIES, economics=economics)


def run_job_point(
    config, base: SimulationSettings, point: TruthPoint, pods, nodes, load, workers: int | None = None
) -> dict[str, Any]:
    started = time.perf_counter()
    inputs = build_inputs(config, point_settings(base, point), pods, nodes, load)
    results, _ = run_strategies(inputs, workers=workers)
    return point_report(point, inputs, results, time.perf_counter() - started)


def point_report(
    point: TruthPoint, inputs: RunInputs, results: dict[str, StrategyResult], seconds: float
) -> dict[str, Any]:
    m = {name: r.metrics for name, r in results.items()}
    static, loop, best = m["static"], m["stackelberg"], m["clairvoyant"]
    learning = results["stackelberg"].extra.get("learning", {})

    def vs_static(row: dict[str, float]) -> dict[str, float]:
        out = {f"{k}_x": row[k] / static[k] for k in COMPARED if static[k]}
        return {**out, "utilisation": row["gpu_utilization"]}

    true_cost = experiment_true_cost(inputs, learning.get("experiment_log", []))
    return {
        "point": point.name,
        "elastic": point.elastic,
        "rigid": point.rigid,
        "latent_ratio": point.latent_ratio,
        "loop_vs_static": vs_static(loop),
        "clairvoyant_vs_static": vs_static(best),
        "static_utilisation": static["gpu_utilization"],
        "regret_share": (best["profit"] - loop["profit"]) / best["profit"],
        "claims_only_regret_share": (best["profit"] - m["claims"]["profit"]) / best["profit"],
        "claims_only_vs_static": vs_static(m["claims"]),
        "experiment_cost_share": true_cost / loop["revenue"],
        "experiment_cost_model_share": _measured_model_cost(inputs, learning) / loop["revenue"],
        "experiment_ticks": learning.get("experiment_ticks", {}),
        "revenue_ge_static": loop["revenue"] >= static["revenue"],
        "promise_breaches": promise_breaches(inputs, results["stackelberg"]),
        "rigid_sla_violations": loop["rigid_sla_violations"],
        "elasticity_error_over_time": elasticity_errors(
            point, learning.get("fit_log", []), inputs.settings.warmup_ticks
        ),
        "seconds": round(seconds, 1),
    }


def _true_profit(inputs: RunInputs, prices: np.ndarray, hour: int, k: float) -> float:
    """The truth's expected profit per hour at `prices`: sum (p - c) x the GPUs the tenants want."""
    wanted = best_response(inputs.model, prices, hour)  # (T, pools) of each tenant's class
    per_resource = np.zeros(prices.size)
    cls = inputs.model.class_column()
    for q in range(wanted.shape[1]):
        np.add.at(per_resource, 2 * q + cls, wanted[:, q])
    cost = np.repeat([p.prices.serve_cost for p in inputs.pools], 2)
    return float(((prices - cost) * k * np.maximum(per_resource, 0.0)).sum())


def experiment_true_cost(inputs: RunInputs, log: list[dict[str, Any]]) -> float:
    """What the experiments gave up by the truth, over the measured window (money)."""
    hours = inputs.settings.tick_seconds / 3600.0
    total = 0.0
    for row in log:
        if row["tick"] < inputs.settings.warmup_ticks:
            continue
        k = float(inputs.load_index[row["tick"]])
        total += hours * (
            _true_profit(inputs, np.array(row["tick_prices"]), row["hour"], k)
            - _true_profit(inputs, np.array(row["published"]), row["hour"], k)
        )
    return total


def _measured_model_cost(inputs: RunInputs, learning: dict[str, Any]) -> float:
    """The loop's own estimate, scaled to the measured window's share of the experiment ticks."""
    log = learning.get("experiment_log", [])
    if not log:
        return 0.0
    measured = sum(1 for row in log if row["tick"] >= inputs.settings.warmup_ticks)
    return (
        learning.get("experiment_model_cost", 0.0)
        * inputs.settings.tick_seconds
        / 3600.0
        * measured
        / len(log)
    )


def promise_breaches(inputs: RunInputs, result: StrategyResult) -> int:
    """Published (tick, pool) pairs above the guaranteed cap or beyond the max step."""
    promises = Promises.from_config(inputs.config, guaranteed_cap=inputs.settings.economics.guaranteed_cap)
    prices = np.asarray(result.series["prices"]).reshape(-1, len(inputs.pools), 2)
    lists = np.array([p.prices.list_price for p in inputs.pools])
    over = promises.over_cap(prices[:, :, 0], lists)
    step = promises.over_step(prices[1:], prices[:-1])
    return int(over.sum() + step.sum())


def elasticity_errors(
    point: TruthPoint, fit_log: list[dict[str, Any]], warmup_ticks: int
) -> list[dict[str, Any]]:
    """At the end of each simulated day (the last refit of the day): the mean absolute error of
    the fits against the class's true elasticity (its centre: the spread and the swing average
    out over tenants and hours), per class, and the fits' count."""
    truth = {
        "guaranteed": max(point.rigid, ELASTICITY_FLOOR),
        "drainable": max(point.elastic, ELASTICITY_FLOOR),
    }
    by_day: dict[int, dict[str, Any]] = {}
    for row in fit_log:
        day = (row["tick"] - warmup_ticks) // 24
        errors: dict[str, list[float]] = {"guaranteed": [], "drainable": []}
        for key, value in row.items():
            if key != "tick" and value[0] is not None:
                cls = key.rsplit("/", 1)[1]
                errors[cls].append(abs(value[0] - truth[cls]))
        by_day[day] = {
            "day": int(day),
            "tick": row["tick"],
            "elastic_mae": round(float(np.mean(errors["drainable"])), 4) if errors["drainable"] else None,
            "rigid_mae": round(float(np.mean(errors["guaranteed"])), 4) if errors["guaranteed"] else None,
        }
    return [by_day[d] for d in sorted(by_day)]


def run_job_grid(
    config,
    base: SimulationSettings,
    points: tuple[TruthPoint, ...],
    pods,
    nodes,
    load,
    workers: int | None = None,
) -> dict[str, Any]:
    rows = [run_job_point(config, base, p, pods, nodes, load, workers) for p in points]
    regrets = [r["regret_share"] for r in rows]
    summary = {
        "points": len(rows),
        "days": base.days,
        "warmup_days": base.warmup_days,
        "seed": base.seed,
        "opening": base.opening,
        "regret_median": median(regrets),
        "regret_worst": max(regrets),
        "experiment_cost_share_worst": max(r["experiment_cost_share"] for r in rows),
        "revenue_ge_static_everywhere": all(r["revenue_ge_static"] for r in rows),
        "promise_breaches": sum(r["promise_breaches"] for r in rows),
        "rigid_sla_violations": sum(r["rigid_sla_violations"] for r in rows),
        "claims_only_regret_median": median(r["claims_only_regret_share"] for r in rows),
        "claims_only_regret_worst": max(r["claims_only_regret_share"] for r in rows),
    }
    summary["targets"] = grid_targets(summary)
    return {"summary": summary, "points": rows}
