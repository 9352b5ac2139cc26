"""Benchmark: fit + forecast for many pools of synthetic, seeded, realistic-length demand."""

from __future__ import annotations

import os
import time
from collections import Counter

from market_pipeline.forecast.pools import forecast_pool_results, results_frame
from market_pipeline.forecast.settings import DEFAULT_SETTINGS, ForecastSettings
from market_pipeline.lab.forecast.synthetic import synthetic_demand_table

TARGET_SECONDS_FOR_500 = 10.0


def run_forecast_bench(
    pools: int, *, days: float = 3.0, seed: int = 0, settings: ForecastSettings | None = None
) -> dict[str, object]:
    """Time `forecast_pools` end to end (resampling, choice, calibration, rows) on `pools` pools.

    Generating the synthetic table is not timed. Wall time depends on what else runs on the
    machine, so CPU time and the load average at the start are reported next to it.
    """
    settings = settings or DEFAULT_SETTINGS
    table = synthetic_demand_table(pools, days=days, seed=seed)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    results = forecast_pool_results(table, settings=settings)
    frame = results_frame(results, table.schema["ts"])
    seconds = time.perf_counter() - wall_start
    cpu_seconds = time.process_time() - cpu_start
    target = TARGET_SECONDS_FOR_500 * pools / 500
    return {
        "pools": pools,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "seconds_per_pool": round(seconds / max(pools, 1), 5),
        "target_seconds": target,
        "within_target": seconds <= target,
        "points_per_pool": table.height // max(pools, 1),
        "days": days,
        "seed": seed,
        "rows": frame.height,
        "chosen_models": dict(Counter(r.forecast.model for r in results)),
        "coarse_models": dict(Counter(r.forecast.coarse_model for r in results)),
        "fallbacks": sum(r.forecast.fallback_reason is not None for r in results),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": None if load_before is None else round(load_before, 2),
        "model_version": settings.model_version(),
    }
