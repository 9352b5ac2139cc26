"""Scaling policy per pool: size for the forecast, scale down only when safe and worth it.

Entry points: `market_pipeline.scaling.policy.plan_pool` (one tick, live or replayed),
`market_pipeline.scaling.capacity.tick_price` (the interval's shielded price) and the
`scaling-eval` replay in `market_pipeline.scaling.replay`; `scaling-tune`
(`market_pipeline.scaling.tuning`) chooses the shipped defaults on held-out days.
"""
