"""The scaling policy offline: the `scaling-eval` replay of Helios demand (`replay`) on a simulated
fleet (`fleet_sim`) against a cluster-autoscaler baseline (`baseline`), its causal forecaster
(`forecast`), and `scaling-tune` (`tuning`), which chooses the shipped defaults on held-out days.
Each tick calls the live `market_pipeline.scaling.policy.plan_pool`."""
