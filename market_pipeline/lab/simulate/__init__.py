"""Offline market simulator: pricing strategies and placement policies on real traces.

    from market_pipeline.lab.simulate import SimulationSettings, simulate_files
    report = simulate_files(load_config(), SimulationSettings(days=7), pods="openb_pod_list_default.csv",
                            nodes="openb_node_list_gpu_node.csv", loads=["helios-earth/vc6YE.csv"],
                            placement=("round_robin", "best_fit", "fragment_aware"))

A discrete-event loop over the simulated adapter's fleet and workload model (`fleet`),
placing jobs with the live placement policies (`placement`), pricing with the live
engine, forecaster and guardrails (`market`, `forecast`, `tick.certificate`). See `tenants` for
the calibration every strategy shares, `settings` for the assumptions (guaranteed price cap,
budgets, the leader's cost), `deferral` for time shifting of priced-out elastic work and
`cluster` for the incremental best-fit placement the strategy runs use.
"""

from __future__ import annotations

from market_pipeline import lazy_exports

# Public names and their modules; loaded on first use so that `market-pipeline --help`
# (which imports every command module) does not pay for torch and the solver.
_EXPORTS = {
    "EconomicAssumptions": "settings",
    "FleetNodes": "inputs",
    "LoadProfile": "inputs",
    "PodTable": "inputs",
    "SimulationInputError": "errors",
    "SimulationSettings": "settings",
    "load_helios": "inputs",
    "load_nodes": "inputs",
    "load_pods": "inputs",
    "simulate": "simulation",
    "simulate_files": "simulation",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
