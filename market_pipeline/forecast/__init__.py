"""Demand forecasting per pool: candidate models, rolling-origin choice, conformal intervals.

Entry points: `fit_and_forecast` (one pool's history array), `forecast_pools` (a long demand
table -> long forecast table), `forecast_pool_results` + `results_frame` (the same, keeping
histories for plots and metadata), `plot_forecast_png`, and the Helios backtest.
"""

import importlib

# Exported name -> submodule. Loaded on first use so that importing a light submodule (the CLI
# reads `settings` to build its parser) does not pull in scikit-learn and SciPy.
_EXPORTS = {
    "BacktestResult": "backtest", "backtest_series": "backtest", "load_helios_series": "backtest",
    "plot_forecast_png": "plotting",
    "PoolForecast": "pool", "fit_and_forecast": "pool",
    "FORECAST_SCHEMA": "pools", "PoolResult": "pools", "busiest_pools": "pools",
    "demand_from_running_pending": "pools", "forecast_pool_results": "pools",
    "forecast_pools": "pools", "results_frame": "pools", "summary_rows": "pools",
    "DEFAULT_SETTINGS": "settings", "FORECASTER_VERSION": "settings",
    "ForecastInputError": "settings", "ForecastSettings": "settings",
    "ForecastSettingsError": "settings",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
