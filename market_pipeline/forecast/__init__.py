"""Demand forecasting per pool: candidate models, rolling-origin choice, online conformal
intervals, and the readers the control loop calls.

Entry points: `fit_and_forecast` (one pool's history array; optional `context`, a
`DemandContext` of task lifetimes, running ages and arrival rate), `forecast_pools` (a long
demand table -> long forecast table), `forecast_pool_results` + `results_frame` (the same,
keeping histories for plots and metadata), `plot_forecast_png`, and the Helios backtest.

Reading a horizon (scaling policy, backlog certificate): from 5 minutes to 24 hours,

    from market_pipeline.forecast.horizons import upper_quantile_at, quantile_at
    q90_4h = upper_quantile_at(result, 240)      # result: PoolResult or PoolForecast
    q50_90m = quantile_at(result, 90, "q50")

interpolating the 5-minute path (to 1 h) and the hourly curve beyond it; a horizon past the
last point raises ForecastInputError.

Intervals: split conformal on volatility-normalised residuals gives the starting quantiles;
an online quantile tracker per horizon (online.py) then follows the observed misses, each
judged when its target is observed, so coverage holds through regime changes. Every
forecast reports `online_steps` (rows the tracker has seen), `recent_coverage` and
`recent_tie_floor` (the least coverage those rows allow: targets equal to the point, demand
that did not move, are covered by every interval).

Operator view: `operator_metadata(results)` (plain dict for the asset's metadata: a markdown
table `forecast_operator_table` of model, chosen_by, tracker steps and rolling 1 h / 4 h
coverage and tie floor per pool, plus counts and pooled values) and `coverage_check(results)`
(a `CoverageCheck(passed, reason, warnings)`: pooled rolling 80% coverage within 0.7-0.9,
the upper end raised where ties lift the floor; pools on a fallback persistence forecast
are warnings).

Import the concrete modules directly; this package re-exports nothing.
"""
