"""Scaling policy per pool: size for the forecast, scale down only when safe and worth it.

Entry points: `market_pipeline.scaling.policy.plan_pool` (one tick, live or replayed; the
interval's shielded price is the market tick's, `market_pipeline.tick`) and the
`scaling-eval` replay in `market_pipeline.lab.scaling.replay`; `scaling-tune`
(`market_pipeline.lab.scaling.tuning`) chooses the shipped defaults on held-out days.
"""
