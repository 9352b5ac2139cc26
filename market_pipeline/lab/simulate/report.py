"""The simulation report: one JSON-ready dict (strategies, placement, targets, inputs,
assumptions, series) and its markdown strategy table."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the tables below are read by the Dagster asset, which need not load the engine
    from market_pipeline.lab.simulate.metrics import StrategyResult
    from market_pipeline.lab.simulate.run_inputs import RunInputs

REQUIRED_STRATEGY_KEYS = (
    "revenue",
    "profit",
    "gpu_utilization",
    "wait_p50_s",
    "wait_p99_s",
    "elastic_cost_per_gpu_hour",
    "rigid_cost_per_gpu_hour",
    "drains",
    "rigid_sla_violations",
)
REQUIRED_PLACEMENT_KEYS = ("unallocated_gpus_at_saturation", "allocation_ratio", "rejected_pods")
TABLE_COLUMNS = (
    ("revenue", "revenue", "{:,.0f}"),
    ("profit", "profit", "{:,.0f}"),
    ("gpu_utilization", "GPU util", "{:.3f}"),
    ("wait_p50_s", "wait p50 s", "{:,.0f}"),
    ("wait_p99_s", "wait p99 s", "{:,.0f}"),
    ("elastic_cost_per_gpu_hour", "elastic $/GPUh", "{:.3f}"),
    ("rigid_cost_per_gpu_hour", "rigid $/GPUh", "{:.3f}"),
    ("drains", "drains", "{:d}"),
    ("work_lost_gpu_hours", "work lost GPUh", "{:.1f}"),
    ("rigid_sla_violations", "rigid SLA viol.", "{:d}"),
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def _series(inputs: RunInputs, results: dict[str, StrategyResult]) -> dict[str, Any]:
    capacity = np.array([p.gpus for p in inputs.pools], dtype=np.float64)
    list_price = np.array([p.prices.list_price for p in inputs.pools])
    weights = capacity / capacity.sum()
    hours = (np.arange(inputs.settings.ticks) * inputs.settings.tick_minutes / 60.0).round(4)
    window = inputs.load_index[inputs.settings.warmup_ticks :]  # the measured window
    out: dict[str, Any] = {"hours": hours, "load_index": window, "strategies": {}}
    for name, result in results.items():
        prices = result.series["prices"].reshape(len(hours), -1, 2)
        relative = prices / list_price[None, :, None]
        out["strategies"][name] = {
            "price_guaranteed_rel": relative[:, :, 0] @ weights,
            "price_drainable_rel": relative[:, :, 1] @ weights,
            "utilization": result.series["utilization"] @ weights,
            "allocated_rigid_gpus": result.series["allocated_by_class"][:, 0],
            "allocated_elastic_gpus": result.series["allocated_by_class"][:, 1],
            "pending_gpus": result.series["pending_by_class"].sum(axis=1),
            "arrivals": result.series["arrivals"],
        }
    return out


def target_checks(
    strategies: dict[str, dict[str, Any]], placement: dict[str, dict[str, Any]], wall_seconds: float | None
) -> dict[str, dict[str, Any]]:
    """The issue's targets, each with the measured value, the bound and pass/fail (None
    when a needed strategy or policy was not run)."""
    checks: dict[str, dict[str, Any]] = {}

    def check(name: str, value: float | None, bound: float | None, ok: bool | None) -> None:
        checks[name] = {"value": value, "bound": bound, "pass": ok}

    stack, static, util = (
        strategies.get("stackelberg"),
        strategies.get("static"),
        strategies.get("utilization"),
    )

    def ratio(a: dict | None, b: dict | None, key: str) -> float | None:
        if a is None or b is None or not a.get(key) or not b.get(key):
            return None
        return float(a[key]) / float(b[key])

    rev = ratio(stack, static, "revenue")
    check("revenue_vs_static", rev, 1.15, None if rev is None else rev >= 1.15)
    rev_u = ratio(stack, util, "revenue")
    check("revenue_vs_utilization", rev_u, 1.0, None if rev_u is None else rev_u >= 1.0)
    use = None if stack is None else stack.get("gpu_utilization")
    check("gpu_utilization", use, 0.80, None if use is None else use >= 0.80)
    # the trace's elastic tenants (latent twins buy nothing at the static price: no baseline)
    key = (
        "trace_elastic_cost_per_gpu_hour"
        if stack and stack.get("trace_elastic_cost_per_gpu_hour")
        else "elastic_cost_per_gpu_hour"
    )
    el = ratio(stack, static, key)
    check("elastic_cost_vs_static", el, 0.90, None if el is None else el <= 0.90)
    ri = ratio(stack, static, "rigid_cost_per_gpu_hour")
    check("rigid_cost_vs_static", ri, 1.05, None if ri is None else ri <= 1.05)
    index = rigid_price_index(stack, static)
    if index is not None:  # needs the per-pool breakdown (runs of this version)
        check(
            "rigid_price_index_vs_static", index, 1.05, index <= 1.05 * (1 + 1e-9)
        )  # float noise at the cap
    sla = None if stack is None else stack.get("rigid_sla_violations")
    check("rigid_sla_violations", sla, 0, None if sla is None else sla == 0)
    fa, bf = placement.get("fragment_aware"), placement.get("best_fit")
    cut = None
    if fa and bf and bf.get("unallocated_gpus_at_saturation"):
        cut = 1.0 - fa["unallocated_gpus_at_saturation"] / bf["unallocated_gpus_at_saturation"]
    check("fragment_aware_unallocated_cut_vs_best_fit", cut, 0.30, None if cut is None else cut >= 0.30)
    check("wall_seconds", wall_seconds, 60.0, None if wall_seconds is None else wall_seconds <= 60.0)
    return checks


def rigid_price_index(stack: dict[str, Any] | None, static: dict[str, Any] | None) -> float | None:
    """Rigid tenants' price change at static's basket (a Laspeyres index): each pool's mean
    rigid price under `stack` weighted by static's rigid GPU-hours there, over static's
    rigid revenue. The plain cost-per-GPU-hour ratio also moves with the pool mix (list
    prices differ 4x between T4 and G2), not only with prices."""
    try:
        hours = np.asarray(static["extra"]["rigid_gpu_hours_by_pool"])  # type: ignore[index]
        base = np.asarray(static["extra"]["rigid_revenue_by_pool"])  # type: ignore[index]
        s_hours = np.asarray(stack["extra"]["rigid_gpu_hours_by_pool"])  # type: ignore[index]
        s_rev = np.asarray(stack["extra"]["rigid_revenue_by_pool"])  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    used = (hours > 0) & (s_hours > 0)
    if not used.any() or base[used].sum() <= 0:
        return None
    return float((hours[used] * s_rev[used] / s_hours[used]).sum() / base[used].sum())


def model_notes(economics: Any, settings: Any = None) -> list[str]:
    """The modelled mechanisms and the assumptions that bound the result, in words, with this
    run's values (the JSON `model_notes` and the HTML page show them)."""
    e = economics
    cap = (
        "the config's guaranteed_price_cap x list"
        if e.guaranteed_cap is None
        else f"{e.guaranteed_cap:g} x list"
    )
    warm = settings.warmup_ticks * settings.tick_minutes / 1440 if settings is not None else 0.0
    notes = [
        "Calibration (every strategy alike): at the list price each tenant demands its share of "
        f"the trace's load; price elasticity there {e.elastic_elasticity:g} (elastic: BE, Burstable) / "
        f"{e.rigid_elasticity:g} (rigid: LS, Guaranteed); budget {1 + e.budget_headroom:g} x spend at "
        "the list price.",
        f"Latent elastic demand (an assumption, not in the trace): each elastic tenant has a twin that "
        f"buys nothing at the list price and, at half of it, {e.latent_elastic_ratio:g} x the tenant's "
        "list-price demand (same jobs, same curvature; budget at that reference). Static and "
        "utilisation-based pricing never go below list, so they see none of it. "
        + (
            "0 here: the trace alone."
            if e.latent_elastic_ratio == 0
            else "Revenue and utilisation above static come mostly from it: openb's elastic work is 17% "
            "of the GPU-hours and its tenants' budgets cap their spend."
        ),
        f"Budgets bound revenue: no trace tenant spends more than {1 + e.budget_headroom:g} x its "
        "list-price spend per hour at the same load.",
        f"Guaranteed (rigid) price capped at {cap}: the solver's price_max for the guaranteed class, "
        "the backlog shield and the utilisation premium all respect it; the drainable class sells "
        "at least the configured minimum discount below it. rigid_cost_vs_static also moves with "
        "the pool mix (list prices differ 4x across models); rigid_price_index_vs_static holds "
        "static's mix fixed.",
        f"Cost: the leader prices against {e.avoidable_cost_share:g} x the unit cost per sold GPU-hour "
        f"(the energy of a busy over an idle GPU: the fixed fleet's capex is sunk); profit also charges "
        f"{1 - e.avoidable_cost_share:g} x the unit cost on every powered GPU-hour, every strategy alike.",
        f"Time shifting: priced-out elastic work waits up to {e.elastic_patience_hours:g} h for a tick "
        "whose price it accepts (same reservation price), else it is lost; priced-out rigid work is "
        "lost. Under a constant price nothing deferred is bought later.",
        "Start: each run opens from the steady state of its own opening prices (openb's jobs run for "
        f"days to weeks), then runs {warm:g} unmeasured warm-up day(s) of the trace before the window.",
        "Queueing: every strategy queues what it admitted but cannot place (rigid first); a rigid job "
        "whose pool is full runs on another GPU model it fits (the trace names none) at its own pool's "
        "price; drains and spills are retried every control-loop tick. Utilisation = allocated "
        "GPU-seconds / GPU-seconds of the (fixed, always powered) fleet, the same for every strategy.",
    ]
    return notes


def build_report(
    inputs: RunInputs,
    results: dict[str, StrategyResult],
    placement: dict[str, dict[str, Any]],
    timing: dict[str, float],
    sources: dict[str, Any],
) -> dict[str, Any]:
    s = inputs.settings
    strategies = {name: r.to_dict() for name, r in results.items()}
    pools = [
        {"pool": p.pool_id, "gpus": p.gpus, "nodes": int(p.node_rows.size), **dataclasses.asdict(p.prices)}
        for p in inputs.pools
    ]
    model = inputs.model
    report = {
        "strategies": strategies,
        "placement": placement,
        "targets": target_checks(strategies, placement, timing.get("total_seconds")),
        "inputs": {
            **sources,
            "fleet_gpus": int(inputs.nodes.total_gpus),
            "fleet_nodes": int(inputs.nodes.size),
            "pods_used": int(inputs.pods.size),
            "pods_excluded": dict(inputs.pods.excluded),
            "load_level_gpus": model.level_gpus,
            "target_utilization": model.level_gpus / max(inputs.nodes.total_gpus, 1),
            "load_window_mean_index": float(np.mean(inputs.load_index[s.warmup_ticks :])),
            "offered_load_ratio": float(np.mean(inputs.load_index[s.warmup_ticks :]))
            * model.level_gpus
            / max(inputs.nodes.total_gpus, 1),
            "pools": pools,
            "tenants": {
                "elastic": int((model.elastic & ~model.latent_mask).sum()),
                "rigid": int((~model.elastic).sum()),
                "latent_elastic": int(model.latent_mask.sum()),
                "elastic_load_share": float(model.base_demand[model.elastic].sum() / model.base_demand.sum()),
            },
            "initial_jobs": int(inputs.initial.tenant.size),
            "rigid_sla_wait_s": inputs.sla_wait_s,
        },
        "settings": {k: v for k, v in dataclasses.asdict(s).items() if k != "economics"},
        "assumptions": dataclasses.asdict(s.economics),
        "model_notes": model_notes(s.economics, s),
        "timing": timing,
        "series": _series(inputs, results),
        "rigid_guarantee": _rigid_guarantee(inputs, results),
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return _jsonable(report)


def _rigid_guarantee(inputs: RunInputs, results: dict[str, StrategyResult]) -> dict[str, Any]:
    """The promise to rigid tenants per tick, each strategy against static (`simulate.guarantee`)."""
    from market_pipeline.lab.simulate.guarantee import guarantee_check

    static = results.get("static")
    if static is None:
        return {}
    promise = inputs.config.guardrails.rigid_guarantee
    return {name: guarantee_check(static, r, promise) for name, r in results.items() if name != "static"}


def strategy_table_markdown(report: dict[str, Any]) -> str:
    header = "| strategy | " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(TABLE_COLUMNS) + 1)]
    for name, metrics in report.get("strategies", {}).items():
        cells = []
        for key, _, fmt in TABLE_COLUMNS:
            value = metrics.get(key)
            cells.append("-" if value is None else fmt.format(value))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def placement_table_markdown(report: dict[str, Any]) -> str:
    lines = [
        "| policy | unallocated GPUs at saturation | allocation ratio | rejected pods |",
        "|---|---|---|---|",
    ]
    for name, row in report.get("placement", {}).items():
        lines.append(
            f"| {name} | {row.get('unallocated_gpus_at_saturation', 0):,.1f} | "
            f"{row.get('allocation_ratio', 0):.4f} | {row.get('rejected_pods', 0):,} |"
        )
    return "\n".join(lines)


def targets_table_markdown(report: dict[str, Any]) -> str:
    lines = ["| target | value | bound | pass |", "|---|---|---|---|"]
    for name, row in report.get("targets", {}).items():
        value = row.get("value")
        shown = "-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
        verdict = {True: "yes", False: "NO", None: "-"}[row.get("pass")]
        lines.append(f"| {name} | {shown} | {row.get('bound')} | {verdict} |")
    return "\n".join(lines)
