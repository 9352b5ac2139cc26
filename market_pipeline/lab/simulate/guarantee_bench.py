"""`market-pipeline bench guarantee`: the rigid guarantee judged on a grid of weeks.

Each week is an openb pod sample x a Helios cluster's load x a seed, simulated with static
and learning Stackelberg pricing from each strategy's own opening state (the setting under
which the promise broke), with the guarantee on (`[guardrails.rigid_guarantee]` as
configured) and, with `--before`, off (the old behaviour) for comparison. Per week it reports
the issue's targets:

- rigid SLA violations and rigid jobs waiting at the end <= static's;
- revenue >= 1.10x static, elastic cost <= 0.90x static, rigid cost <= 1.05x static;
- 0 promise breaches: the rigid promise on every tick (`simulate.guarantee`) and the price
  promises (guaranteed cap, max step) on every published price.

With `--ceiling` each week also runs the clairvoyant leader (`runner.make_strategy`
"clairvoyant": the same tick on the tenants' true response, hour by hour, no experiments), the
yardstick of what the market can earn on that week. A week whose only miss is revenue, where
the rigid promise held and even the clairvoyant leader earns less than the revenue target, is
`beyond_ceiling`: the target lies outside what this market earns on that week (on
`gpuspec25/vc3sl/s7` the clairvoyant leader earned 1.099x while breaking the rigid promise),
so the guarantee wins and the row says what it cost (`revenue_gap_to_ceiling`). A week
where the clairvoyant leader reaches the target and the loop does not is a plain `fail`.

With `--premium-only` each week also runs static pricing plus the guaranteed premium and
nothing else (`pricing.PremiumPricing`): its rigid figures and breach ticks against static
(`premium_only`) say how much of a week's rigid result the premium alone makes, where a pool is
full of rigid work that may run nowhere else and no drainable price or drain reaches it. The
verdict does not read it.

The weeks are split by role: the shared traces' weeks (the default pod sample with the four
shared Helios clusters) are where the hold's size was chosen (`tuning`); weeks from other
pod samples and clusters are `judged`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.lab.simulate.guarantee import guarantee_check
from market_pipeline.lab.simulate.inputs import load_helios, load_nodes, load_pods
from market_pipeline.lab.simulate.job_grid import promise_breaches
from market_pipeline.lab.simulate.metrics import StrategyResult
from market_pipeline.lab.simulate.pricing import ELASTIC
from market_pipeline.lab.simulate.runner import build_inputs, run_strategies
from market_pipeline.lab.simulate.settings import SimulationSettings

TARGETS = {"revenue_vs_static": 1.10, "elastic_cost_vs_static": 0.90, "rigid_cost_vs_static": 1.05}
CEILING = "clairvoyant"  # the leader that knows the tenants' true response
PREMIUM = "premium"  # static pricing plus the guaranteed premium, nothing else
PASS, BEYOND_CEILING, FAIL = "pass", "beyond_ceiling", "fail"


@dataclass(frozen=True)
class Week:
    pods: str
    load: str
    seed: int
    role: str  # tuning | judged

    @property
    def name(self) -> str:
        return f"{Path(self.pods).stem.removeprefix('openb_pod_list_')}/{Path(self.load).stem}/s{self.seed}"


def _ratio(a: StrategyResult, b: StrategyResult, key: str) -> float | None:
    x, y = a.metrics.get(key), b.metrics.get(key)
    return None if x is None or not y else float(x) / float(y)


def _elastic_key(stack: StrategyResult) -> str:
    return (
        "trace_elastic_cost_per_gpu_hour"
        if stack.metrics.get("trace_elastic_cost_per_gpu_hour")
        else ("elastic_cost_per_gpu_hour")
    )


# What an elastic cost ratio is taken against (`elastic_cost_ratio`).
BASE_STATIC_SALES = "static_sales"
BASE_STATIC_LIST = "static_list_at_market_hours"
NONE_SOLD = "none_sold"  # neither run sold a drainable GPU-hour: the target has nothing to judge


def _sold(result: StrategyResult) -> bool:
    return bool(result.metrics.get("elastic_cost_per_gpu_hour"))


def elastic_cost_ratio(stack: StrategyResult, static: StrategyResult) -> tuple[float | None, str | None]:
    """The drainable tenants' cost per GPU-hour under `stack` against static pricing, and its
    base:
    - `static_sales`: static's own cost per GPU-hour, where both sold drainable GPU-hours;
    - `static_list_at_market_hours`: where static sold none (a week whose guaranteed work fills
      the fleet under static prices), static's price is still posted; the base is what static
      asks for the GPU-hours the market sold, pool by pool, at those prices (a Paasche index at
      the market's basket);
    - `none_sold` (ratio None): neither run sold one, so no drainable tenant paid anything on
      the week under either price (`gpushare60/vcdI0/s293`: guaranteed work waited in every
      pool on every tick, each closed to drainable work);
    - None (ratio None): the market sold none where static sold some, a miss."""
    if not _sold(stack):
        return None, (None if _sold(static) else NONE_SOLD)
    key = _elastic_key(stack)
    ratio = _ratio(stack, static, key)
    if ratio is not None:
        return ratio, BASE_STATIC_SALES
    cost = stack.metrics.get(key)
    hours_key = "trace_elastic_gpu_hours_by_pool" if key.startswith("trace_") else "elastic_gpu_hours_by_pool"
    hours = np.asarray(stack.extra.get(hours_key, ()), dtype=float)
    prices = np.asarray(static.series.get("prices", ()), dtype=float)
    if cost is None or hours.size == 0 or hours.sum() <= 0 or prices.size == 0:
        return None, None
    posted = prices.reshape(-1, hours.size, 2)[:, :, ELASTIC].mean(axis=0)
    base = float((hours * posted).sum() / hours.sum())
    return (float(cost) / base, BASE_STATIC_LIST) if base > 0 else (None, None)


def _elastic_met(ratio: float | None, base: str | None) -> bool:
    """The elastic cost target: met at or under its ratio, and where nothing was sold to
    judge (`none_sold`); a ratio with no base otherwise is a miss."""
    if base == NONE_SOLD:
        return True
    return ratio is not None and ratio <= TARGETS["elastic_cost_vs_static"]


def judge(
    config: MarketPipelineConfig,
    inputs: Any,
    static: StrategyResult,
    stack: StrategyResult,
    ceiling: StrategyResult | None = None,
    premium: StrategyResult | None = None,
) -> dict[str, Any]:
    """One week's figures against the targets; with `ceiling` (the clairvoyant leader's run),
    what the market could earn on the week and the verdict that follows (`verdict`); with
    `premium` (static pricing plus the guaranteed premium, `pricing.PremiumPricing`), what the
    premium alone does to rigid work on the week (`premium_only`; the verdict does not read
    it)."""
    promise = config.guardrails.rigid_guarantee
    check = guarantee_check(static, stack, promise)
    elastic_cost, elastic_base = elastic_cost_ratio(stack, static)
    row: dict[str, Any] = {
        "revenue_vs_static": _ratio(stack, static, "revenue"),
        "elastic_cost_vs_static": elastic_cost,
        "elastic_cost_base": elastic_base,
        "elastic_cost_met": _elastic_met(elastic_cost, elastic_base),
        "rigid_cost_vs_static": _ratio(stack, static, "rigid_cost_per_gpu_hour"),
        "rigid_sla_violations": [
            static.metrics["rigid_sla_violations"],
            stack.metrics["rigid_sla_violations"],
        ],
        "rigid_waiting_at_end": [
            static.metrics["rigid_waiting_at_end"],
            stack.metrics["rigid_waiting_at_end"],
        ],
        "jobs_waiting_at_end": [static.metrics["jobs_waiting_at_end"], stack.metrics["jobs_waiting_at_end"]],
        "rigid_wait_p99_s": [static.metrics.get("rigid_wait_p99_s"), stack.metrics.get("rigid_wait_p99_s")],
        "drains": stack.metrics["drains"],
        "rigid_promise": check,
        "price_promise_breaches": promise_breaches(inputs, stack),
    }
    sla, wait = row["rigid_sla_violations"], row["rigid_waiting_at_end"]
    row["rigid_ok"] = bool(
        sla[1] <= promise.max_violations_vs_static * sla[0]
        and wait[1] <= promise.max_waiting_vs_static * wait[0]
    )
    row["market_ok"] = bool(
        (row["revenue_vs_static"] or 0) >= TARGETS["revenue_vs_static"]
        and row["elastic_cost_met"]
        and (row["rigid_cost_vs_static"] or 9) <= TARGETS["rigid_cost_vs_static"]
    )
    row["breaches"] = check["breach_ticks"] + row["price_promise_breaches"]
    row["pass"] = row["rigid_ok"] and row["market_ok"] and row["breaches"] == 0
    if ceiling is not None:
        row["ceiling"] = {
            "revenue_vs_static": _ratio(ceiling, static, "revenue"),
            "elastic_cost_vs_static": elastic_cost_ratio(ceiling, static)[0],
            "rigid_sla_violations": ceiling.metrics["rigid_sla_violations"],
            "rigid_breach_ticks": guarantee_check(static, ceiling, promise)["breach_ticks"],
        }
        row["revenue_gap_to_ceiling"] = (row["ceiling"]["revenue_vs_static"] or 0.0) - (
            row["revenue_vs_static"] or 0.0
        )
    if premium is not None:
        row["premium_only"] = {
            "revenue_vs_static": _ratio(premium, static, "revenue"),
            "rigid_sla_violations": premium.metrics["rigid_sla_violations"],
            "rigid_waiting_at_end": premium.metrics["rigid_waiting_at_end"],
            "rigid_breach_ticks": guarantee_check(static, premium, promise)["breach_ticks"],
        }
    row["verdict"] = verdict(row)
    return row


def verdict(row: dict[str, Any]) -> str:
    """`pass`: every target met. `beyond_ceiling`: the rigid promise held on every tick, both
    cost targets were met, and revenue fell short of its target where the clairvoyant leader
    (`row["ceiling"]`, when run) falls short of it too: the target is outside what the market
    earns on that week, and the guarantee wins. `fail`: anything else."""
    if row["pass"]:
        return PASS
    ceiling = row.get("ceiling")
    costs_met = (
        _elastic_met(row["elastic_cost_vs_static"], row.get("elastic_cost_base"))
        and (row["rigid_cost_vs_static"] or 9) <= TARGETS["rigid_cost_vs_static"]
    )
    if (
        ceiling is not None
        and row["rigid_ok"]
        and row["breaches"] == 0
        and costs_met
        and (ceiling["revenue_vs_static"] or 0) < TARGETS["revenue_vs_static"]
    ):
        return BEYOND_CEILING
    return FAIL


def run_week(
    config: MarketPipelineConfig,
    week: Week,
    nodes_file: str,
    days: float,
    warmup_days: float,
    before: bool,
    workers: int | None,
    ceiling: bool = False,
    load_start_day: float = SimulationSettings.load_start_day,
    premium: bool = False,
) -> dict[str, Any]:
    started = time.perf_counter()
    strategies = ("static", "stackelberg") + ((CEILING,) if ceiling else ()) + ((PREMIUM,) if premium else ())
    settings = SimulationSettings(
        days=days,
        warmup_days=warmup_days,
        seed=week.seed,
        strategies=strategies,
        load_start_day=load_start_day,
    )
    pods, nodes = load_pods(week.pods), load_nodes(nodes_file, config)
    load = load_helios([week.load], settings.tick_minutes)
    row: dict[str, Any] = {"week": week.name, "role": week.role}
    variants = [("after", config)]
    if before:
        guardrails = config.guardrails
        off = config.model_copy(
            update={
                "guardrails": guardrails.model_copy(
                    update={
                        "rigid_guarantee": guardrails.rigid_guarantee.model_copy(update={"enabled": False})
                    }
                )
            }
        )
        variants.append(("before", off))
    for label, cfg in variants:
        # the ceiling is run with the configured guarantee only (the week's yardstick)
        run_settings = (
            settings if label == "after" else replace(settings, strategies=("static", "stackelberg"))
        )
        inputs = build_inputs(cfg, run_settings, pods, nodes, load)
        results, _ = run_strategies(inputs, workers=workers)
        row[label] = judge(
            config,
            inputs,
            results["static"],
            results["stackelberg"],
            results.get(CEILING),
            results.get(PREMIUM),
        )
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def run_grid(
    config: MarketPipelineConfig,
    weeks: list[Week],
    nodes: str,
    days: float,
    warmup_days: float,
    before: bool,
    workers: int | None = None,
    ceiling: bool = False,
    load_start_day: float = SimulationSettings.load_start_day,
    premium: bool = False,
) -> dict[str, Any]:
    rows = [
        run_week(config, w, nodes, days, warmup_days, before, workers, ceiling, load_start_day, premium)
        for w in weeks
    ]
    summary: dict[str, Any] = {
        "days": days,
        "warmup_days": warmup_days,
        "load_start_day": load_start_day,
        # the guaranteed premium's rule the market ran under (config, `tick.promises`)
        "premium_follows_reach": config.guardrails.rigid_guarantee.premium_follows_reach,
        # whether drainable work left the guaranteed claim expected, not only the claim now
        "drainable_leaves_expected_claim": config.guardrails.rigid_guarantee.drainable_leaves_expected_claim,
        "weeks": len(rows),
    }
    for role in ("tuning", "judged"):
        mine = [r for r in rows if r["role"] == role]
        if not mine:
            continue
        after = [r["after"] for r in mine]
        summary[role] = {
            "weeks": len(mine),
            "pass": sum(a["pass"] for a in after),
            "beyond_ceiling": sum(a["verdict"] == BEYOND_CEILING for a in after),
            "fail": sum(a["verdict"] == FAIL for a in after),
            "rigid_ok": sum(a["rigid_ok"] for a in after),
            "market_ok": sum(a["market_ok"] for a in after),
            "breaches": sum(a["breaches"] for a in after),
            "revenue_vs_static_min": min((a["revenue_vs_static"] or 0) for a in after),
        }
        if before:
            prior = [r["before"] for r in mine]
            summary[role]["before_rigid_ok"] = sum(a["rigid_ok"] for a in prior)
            summary[role]["before_revenue_vs_static_min"] = min((a["revenue_vs_static"] or 0) for a in prior)
    return {"summary": summary, "weeks": rows}


def table(report: dict[str, Any]) -> list[str]:
    """The grid as markdown rows (the docs and the report quote it)."""
    lines = [
        "| week | role | rev x | el cost x | rig cost x | rigid SLA viol. (static/market) | rigid waiting (static/market) | breach ticks | ceiling rev x (its breach ticks) | premium-only breach ticks | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["weeks"]:
        for label in ("before", "after"):
            a = r.get(label)
            if a is None:
                continue
            lines.append(
                f"| {r['week']} {label} | {r['role']} | {_times(a['revenue_vs_static'])} | "
                f"{_elastic_cell(a)} | {_times(a['rigid_cost_vs_static'])} | "
                f"{a['rigid_sla_violations'][0]}/{a['rigid_sla_violations'][1]} | "
                f"{a['rigid_waiting_at_end'][0]}/{a['rigid_waiting_at_end'][1]} | {a['breaches']} | "
                f"{_ceiling_cell(a.get('ceiling'))} | {_premium_cell(a.get('premium_only'))} | "
                f"{a.get('verdict', PASS if a['pass'] else FAIL)} |"
            )
    return lines


def _times(ratio: float | None) -> str:
    """A ratio against static pricing; `n/a` where static's figure is zero (`_ratio`), as
    where static pricing sold a class no GPU-hour on the week."""
    return "n/a" if ratio is None else f"{ratio:.3f}"


def _elastic_cell(row: dict[str, Any]) -> str:
    """The elastic cost ratio, marked `(list)` where static pricing sold no drainable GPU-hour
    and its posted prices at the market's basket are the base, `none sold` where neither run
    sold one (`elastic_cost_ratio`)."""
    if row.get("elastic_cost_base") == NONE_SOLD:
        return "none sold"
    cell = _times(row["elastic_cost_vs_static"])
    return f"{cell} (list)" if row.get("elastic_cost_base") == BASE_STATIC_LIST else cell


def _ceiling_cell(ceiling: dict[str, Any] | None) -> str:
    if ceiling is None:
        return "-"
    return f"{_times(ceiling['revenue_vs_static'])} ({ceiling['rigid_breach_ticks']})"


def _premium_cell(premium: dict[str, Any] | None) -> str:
    return "-" if premium is None else str(premium["rigid_breach_ticks"])
