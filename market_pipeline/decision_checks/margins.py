"""Backlog-certificate margins >= 0 where the loop acts on them.

- The market tick: a pool whose published price does not certify the capacity serving it
  (negative margin) must have asked for capacity (its capacity target above the serving
  capacity), which the scaling plan sizes to; a negative margin nobody acts on offends.
- The scaling plan: every pool's capacity target is certified (margin >= 0) unless the
  pool is at `max_nodes`, and every approved action that takes capacity away (cordon,
  scale-down, power-off) keeps the certificate (margin >= 0 at the capacity left).
"""

from __future__ import annotations

import json
import math

import polars as pl

from market_pipeline.decision_checks.verdict import Verdict
from market_pipeline.warehouse.decisions import DecisionAction

REMOVES_CAPACITY = tuple(
    a.value for a in (DecisionAction.CORDON, DecisionAction.SCALE_DOWN, DecisionAction.POWER_OFF)
)
_EPS = 1e-9


def _tick_reason(row: dict) -> str:
    """The tick's own account (e.g. the pool is exhausted: every node already serves)."""
    reason = row.get("guaranteed_reason")
    return f": {reason}" if reason else ""


def _exhausted(row: dict) -> bool:
    """Every GPU the pool can reach already serves: no capacity can be asked, only an operator
    can add nodes (None: a tick stored before the reachable capacity was recorded)."""
    reachable = row.get("reachable_gpus")
    return reachable is not None and row["serving_gpus"] + _EPS >= reachable


def tick_margin_verdict(tick: pl.DataFrame) -> Verdict:
    """`tick`: the latest market tick's rows (pool_id, margin, serving_gpus, capacity_target_gpus,
    reachable_gpus). A negative margin nobody acts on offends; where the pool is exhausted (all
    it can reach already serves) that is an expected outcome the check warns about: the tick
    published the promise window's top and its reason asks an operator for nodes."""
    offenders, exhausted = [], []
    for r in tick.iter_rows(named=True):
        margin = r["margin"]
        if margin is None or not math.isfinite(margin):
            offenders.append({"pool_id": r["pool_id"], "margin": str(margin), "why": "no finite margin"})
        elif margin < -_EPS and r["capacity_target_gpus"] <= r["serving_gpus"] + _EPS:
            (exhausted if _exhausted(r) else offenders).append(
                {
                    "pool_id": r["pool_id"],
                    "margin": round(margin, 4),
                    "why": f"uncertified at {r['serving_gpus']:g} GPUs and no capacity asked "
                    f"(target {r['capacity_target_gpus']:g})" + _tick_reason(r),
                }
            )
    short = tick.filter(pl.col("margin") < -_EPS).height if tick.height else 0
    lowest = float(tick["margin"].min()) if tick.height else 0.0
    numbers = {"pools": tick.height, "uncertified_pools": short, "lowest_margin": round(lowest, 4)}
    if offenders:
        return Verdict(
            False,
            f"{len(offenders)} pool(s) with a negative margin and no capacity asked: "
            + ", ".join(str(o["pool_id"]) for o in offenders),
            offenders + exhausted,
            numbers,
        )
    if exhausted:
        return Verdict(
            False,
            f"{len(exhausted)} pool(s) short of capacity and exhausted (every node serves; add "
            "nodes to the pool): " + ", ".join(str(o["pool_id"]) for o in exhausted),
            exhausted,
            {**numbers, "exhausted_pools": len(exhausted)},
            expected=True,
        )
    return Verdict(
        True,
        f"{tick.height} pool(s): {tick.height - short} certified at their serving capacity, "
        f"{short} short with capacity asked",
        [],
        numbers,
    )


def plan_margin_verdict(plan: pl.DataFrame) -> Verdict:
    """`plan`: one scaling plan's decisions (`warehouse.readers.latest_plan`)."""
    offenders: list[dict[str, object]] = []
    pools: set[str] = set()
    margins: list[float] = []
    for r in plan.iter_rows(named=True):
        inputs = json.loads(r["inputs"]) if isinstance(r["inputs"], str) else dict(r["inputs"] or {})
        margin, pool = inputs.get("certificate_margin"), r["pool_id"]
        if r["allowed"] and margin is not None:
            margins.append(float(margin))
        if pool not in pools and "target_certified" in inputs:
            pools.add(pool)
            at_max = int(inputs.get("target_nodes", 0)) >= int(inputs.get("max_nodes", 0) or 0)
            if not inputs["target_certified"] and not at_max:
                offenders.append(
                    {
                        "pool_id": pool,
                        "target": "",
                        "action": "target",
                        "margin": margin,
                        "why": f"target {inputs.get('target_nodes')} nodes not certified below max_nodes",
                    }
                )
        if r["allowed"] and r["action"] in REMOVES_CAPACITY and margin is not None and margin < -_EPS:
            offenders.append(
                {
                    "pool_id": pool,
                    "target": r["target"],
                    "action": r["action"],
                    "margin": round(float(margin), 4),
                    "why": "takes capacity the certificate needs",
                }
            )
    return Verdict.from_offenders(
        offenders,
        f"{len(pools)} pool target(s) certified; approved removals keep margin >= 0",
        "{n} decision(s) break the certificate: "
        + ", ".join(f"{o['pool_id']} {o['action']}" for o in offenders),
        pools=len(pools),
        decisions=plan.height,
        lowest_margin=round(min(margins), 4) if margins else 0.0,
    )
