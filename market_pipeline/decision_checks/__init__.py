"""The checks on every decision the control loop publishes, as plain functions over the
warehouse (the Dagster asset checks in `assets/<stage>/checks.py` only wrap them):

- `solve`: the equilibrium solve is certified (status, KKT residual within tolerance);
- `prices`: published prices keep their bounds and promises (cap, band, max step);
- `margins`: the backlog certificate's margins the tick and the scaling plan act on are >= 0;
- `flapping`: no node is cordoned or uncordoned more than twice a day;
- `drains`: approved task drains stay within the tenant caps and the pool disruption budgets.

Each returns a `Verdict`: passed, one line for the operator, and the offending rows.
"""

from market_pipeline.decision_checks.verdict import Verdict

__all__ = ["Verdict"]
