"""The equilibrium solve behind the latest market tick is certified.

Certified: the solve converged with its KKT residual within `market.solver_tolerance`; or it
proved demand exceeds capacity even at price_max (`capacity_infeasible`) at a KKT residual
within tolerance: its prices are the best achievable, and the tick's shield already asks
the scaling plan for the capacity.

A fallback solve (no convergence within the iteration cap or the time budget: the tick keeps
the prices in force) is an expected outcome when it says why: the verdict does not pass and
is `expected`, so the check warns and the loop publishes the prices in force. A defect fails:
no report, an unknown status, a fallback without a reason, or a certified status whose
residual is missing, not finite or over tolerance.
"""

from __future__ import annotations

import math

from market_pipeline.decision_checks.verdict import Verdict

CERTIFIED_STATUSES = ("converged", "capacity_infeasible")
FALLBACK_STATUS = "fallback"


def solve_verdict(solve: dict[str, object] | None, tolerance: float) -> Verdict:
    if solve is None:
        return Verdict(False, "no market tick has a solve report")
    status, kkt = str(solve["status"]), solve["kkt_residual"]
    numbers = {"kkt_residual": float(kkt) if kkt is not None else -1.0, "tolerance": tolerance}
    where = f"solve {solve['solve_id']} ({status})"
    if status == FALLBACK_STATUS and solve.get("fallback_reason"):
        return Verdict(
            False,
            f"{where}: the prices in force stay published; {solve['fallback_reason']}",
            [dict(solve)],
            numbers,
            expected=True,
        )
    if status not in CERTIFIED_STATUSES:
        why = solve.get("fallback_reason") or "no reason recorded"
        return Verdict(False, f"{where} is not certified: {why}", [dict(solve)], numbers)
    if kkt is None or not math.isfinite(float(kkt)):
        return Verdict(False, f"{where} reports no finite KKT residual", [dict(solve)], numbers)
    if float(kkt) > tolerance:
        return Verdict(
            False,
            f"{where}: KKT residual {float(kkt):.3g} > tolerance {tolerance:.3g}",
            [dict(solve)],
            numbers,
        )
    return Verdict(True, f"{where}: KKT residual {float(kkt):.3g} <= tolerance {tolerance:.3g}", [], numbers)
