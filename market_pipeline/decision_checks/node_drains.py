"""Scale-downs whose node drain failed: the plan gave the node back (uncordoned it) because its
tasks did not leave in time or a task drain was blocked. The cordon's run succeeded long
before; the failure is known only at the tick that gives up, so that tick's plan says it:
each failed node drain with its reason and attempt (an expected outcome: the check warns).
"""

from __future__ import annotations

import json

import polars as pl

from market_pipeline.decision_checks.verdict import Verdict

FAILED_PREFIX = "scale-down failed:"


def node_drain_verdict(uncordons: pl.DataFrame) -> Verdict:
    """Warns for every uncordon a failed scale-down drain caused (`warehouse.readers.latest_uncordons`)."""
    offenders: list[dict[str, object]] = []
    for row in uncordons.iter_rows(named=True):
        reasons = [str(r) for r in row["reasons"] or []]
        failed = [r for r in reasons if r.startswith(FAILED_PREFIX)]
        if not failed:
            continue
        inputs = json.loads(row["inputs"]) if isinstance(row["inputs"], str) else dict(row["inputs"] or {})
        offenders.append(
            {
                "pool_id": row["pool_id"],
                "node": row["target"],
                "why": failed[0][len(FAILED_PREFIX) :].strip(),
                "attempt": next((r for r in reasons if r.startswith("attempt ")), ""),
                "drain_failures": inputs.get("drain_failures"),
            }
        )
    shown = "; ".join(f"{o['node']} ({o['why']})" for o in offenders[:5])
    verdict = Verdict.from_offenders(
        offenders,
        "no scale-down drain failed at this tick",
        "{n} scale-down drain(s) failed, node(s) uncordoned: " + shown,
        failed_node_drains=len(offenders),
    )
    if verdict.passed:
        return verdict
    return Verdict(False, verdict.description, verdict.offenders, verdict.numbers, expected=True)
