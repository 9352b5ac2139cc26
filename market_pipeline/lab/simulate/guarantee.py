"""The promise to rigid tenants, checked on every simulated tick (config
`[guardrails.rigid_guarantee]`): against static pricing on the same week, a strategy leaves no
more rigid jobs waiting past their SLA wait (`max_waiting_vs_static`) and no more rigid jobs
past their SLA wait so far, started late or still waiting (`max_violations_vs_static`). A tick
where either does not hold is a breach. (Jobs waiting within their SLA wait, e.g. for a
two-minute drain, are the mechanism at work, not a breach.)

The runs record both per tick (`Meter.rigid_waiting_late`, `Meter.rigid_past_sla`); this
compares the two records tick by tick.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from market_pipeline.config.model import RigidGuaranteeConfig
from market_pipeline.lab.simulate.metrics import StrategyResult


def guarantee_check(
    static: StrategyResult, other: StrategyResult, promise: RigidGuaranteeConfig
) -> dict[str, Any]:
    """Per-tick breaches of the rigid promise by `other` against `static`, and the worst
    excess (jobs) of each part."""
    wait_s, wait_o = (np.asarray(r.series["rigid_waiting_late"], dtype=float) for r in (static, other))
    late_s, late_o = (np.asarray(r.series["rigid_past_sla"], dtype=float) for r in (static, other))
    n = min(wait_s.size, wait_o.size)
    over_wait = wait_o[:n] - promise.max_waiting_vs_static * wait_s[:n]
    over_late = late_o[:n] - promise.max_violations_vs_static * late_s[:n]
    breach = (over_wait > 1e-9) | (over_late > 1e-9)
    return {
        "ticks": int(n),
        "breach_ticks": int(breach.sum()),
        "waiting_breach_ticks": int((over_wait > 1e-9).sum()),
        "sla_breach_ticks": int((over_late > 1e-9).sum()),
        "worst_waiting_excess_jobs": float(max(over_wait.max(initial=0.0), 0.0)),
        "worst_sla_excess_jobs": float(max(over_late.max(initial=0.0), 0.0)),
    }
