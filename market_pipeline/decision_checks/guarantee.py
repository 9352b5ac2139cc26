"""The rigid guarantee on the live side (config `[guardrails.rigid_guarantee]`): no
guaranteed task waits past its SLA wait in a GPU model's pools while drainable tasks hold
GPUs of that model. The guarantee's rules (capacity held for waiting guaranteed work,
`placement.guarantee`; drains for it, the task-drain guardrail) exist to make room from
drainable work; a guaranteed task past its SLA beside running drainable work is the
promise broken, which the operator must see (more capacity, or a larger drain budget).

The input is the fleet's queue as the adapter reports it (`pending_summary`: per GPU model,
the guaranteed tasks waiting, the longest such wait and the GPUs drainable tasks hold).
"""

from __future__ import annotations

from collections.abc import Mapping

from market_pipeline.decision_checks.verdict import Verdict


def rigid_guarantee_verdict(pending: Mapping[str, Mapping[str, float]], sla_wait_s: float) -> Verdict:
    offenders: list[dict[str, object]] = []
    for model, row in sorted(pending.items()):
        waited = float(row.get("guaranteed_oldest_wait_s", 0.0))
        drainable = float(row.get("drainable_running_gpus", 0.0))
        if row.get("guaranteed_jobs", 0.0) > 0 and waited > sla_wait_s and drainable > 0:
            offenders.append(
                {
                    "gpu_model": model,
                    "guaranteed_waiting": int(row["guaranteed_jobs"]),
                    "oldest_wait_s": round(waited, 1),
                    "drainable_running_gpus": round(drainable, 3),
                }
            )
    waiting = int(sum(r.get("guaranteed_jobs", 0.0) for r in pending.values()))
    return Verdict.from_offenders(
        offenders,
        f"no guaranteed task waits past its SLA wait ({sla_wait_s:g} s) beside drainable work",
        f"{{n}} GPU model(s) with a guaranteed task waiting past its SLA wait ({sla_wait_s:g} s) "
        "while drainable tasks hold GPUs of that model",
        guaranteed_waiting=waiting,
    )
