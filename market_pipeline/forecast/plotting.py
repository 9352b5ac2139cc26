"""PNG of a pool's recent demand with its forecast band (for operator metadata)."""

from __future__ import annotations

import io

import numpy as np

from market_pipeline.forecast.pool import PoolForecast

DEFAULT_HISTORY_HOURS = 48


def plot_forecast_png(
    history: np.ndarray,
    forecast: PoolForecast,
    *,
    title: str | None = None,
    history_hours: float = DEFAULT_HISTORY_HOURS,
    width_px: int = 900,
    height_px: int = 320,
) -> bytes:
    """History (NaN gaps left blank), the 1 h q10-q90 band and the 24 h hourly band."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    step_hours = forecast.step_minutes / 60.0
    values = np.asarray(history, dtype=float)
    keep = min(values.size, int(history_hours / step_hours))
    recent = values[values.size - keep :]
    history_x = (np.arange(recent.size) - (recent.size - 1)) * step_hours
    fine_x = forecast.horizon_minutes / 60.0
    coarse_x = forecast.coarse_horizon_minutes / 60.0

    dpi = 100
    figure = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    axes = figure.add_subplot(1, 1, 1)
    axes.plot(history_x, recent, color="#333333", linewidth=1.0, label="demand (GPUs)")
    axes.fill_between(
        coarse_x,
        forecast.coarse_q10,
        forecast.coarse_q90,
        color="#9ecae1",
        alpha=0.5,
        step="mid",
        label=f"24 h q10-q90 ({forecast.coarse_model})",
    )
    axes.plot(coarse_x, forecast.coarse_q50, color="#3182bd", linewidth=1.0, linestyle="--")
    axes.fill_between(
        fine_x,
        forecast.q10,
        forecast.q90,
        color="#fdae6b",
        alpha=0.8,
        label=f"1 h q10-q90 ({forecast.model})",
    )
    axes.plot(fine_x, forecast.q50, color="#e6550d", linewidth=1.5, label="q50")
    axes.axvline(0.0, color="#999999", linewidth=0.8)
    axes.set_xlabel("hours from forecast origin")
    axes.set_ylabel("GPUs requested")
    heading = title or "demand forecast"
    if forecast.fallback_reason:
        heading += f" - fallback: {forecast.fallback_reason}"
    axes.set_title(heading, fontsize=9)
    axes.legend(loc="upper left", fontsize=7)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
