"""Demand response learned from the loop's own prices (issue #21).

- `estimator`: the fixed-effects log-log fit per pool x class with an 80% interval;
- `history`: (price, demand) histories from a CSV or the warehouse, fitted per pool x class;
- `experiments`: bounded, randomised price experiments inside every promise, their stop rule
  and cost.

The simulator with hidden truth and a clairvoyant leader (`truth`, `truth_grid`, `grid_run`) and
the histories with a known elasticity (`synthetic`) are the lab's, `lab.demand_response`.

The market tick calibrates its tenant population to the fit in `tick.response`.
"""
