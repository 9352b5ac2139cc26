"""Demand response learned from the loop's own prices (issue #21).

- `estimator`: the fixed-effects log-log fit per pool x class with an 80% interval;
- `history`: (price, demand) histories from a CSV or the warehouse, fitted per pool x class;
- `experiments`: bounded, randomised price experiments inside every promise, their stop rule
  and cost;
- `truth`, `truth_grid`, `grid_run`: the simulator with hidden truth and a clairvoyant leader;
- `synthetic`: histories with a known elasticity, priced the way a live loop prices.

The market tick calibrates its tenant population to the fit in `tick.response`.
"""
