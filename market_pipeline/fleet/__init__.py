"""The fleet/workload model shared by the `simulated` adapter and the offline simulator.

catalog (nodes, GPUs) -> shapes (job shapes: openb pods or the built-in summary) ->
workload (tenants, arrivals) -> twin (capacity, tasks, queue, telemetry, simulated time);
setup.build_setup(config) assembles them from the typed config.
"""
