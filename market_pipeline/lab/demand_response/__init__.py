"""The demand response offline: the simulator with hidden truth and a clairvoyant leader (`truth`,
`truth_grid`, `grid_run`), histories with a known elasticity priced the way a live loop prices
(`synthetic`), the fit's structure bench (`structure_bench`) and `bench demand`."""
