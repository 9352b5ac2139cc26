"""The candidate set for one fit: persistence first, then the challengers the settings name."""

from __future__ import annotations

from market_pipeline.forecast.features import Series, price_varies
from market_pipeline.forecast.models import (
    Candidate,
    ExpSmoothing,
    GbmOnChanges,
    Persistence,
    RidgeOnChanges,
    SeasonalNaive,
)
from market_pipeline.forecast.settings import ForecastSettings
from market_pipeline.forecast.survival import SURVIVAL, DemandContext, SurvivalArrival


def build_candidates(
    settings: ForecastSettings, fit: Series, *, step_minutes: int = 5, context: DemandContext | None = None
) -> list[Candidate]:
    """Persistence first: it is the reference every challenger must beat."""
    with_price = price_varies(fit.price)
    candidates: list[Candidate] = [Persistence()]
    if len(fit) > fit.period + 1:
        candidates.append(SeasonalNaive(fit.period))
    candidates.append(ExpSmoothing())
    learned = {"ridge": RidgeOnChanges, "gbm": GbmOnChanges}
    for name in settings.learned_models:
        if name == SURVIVAL:
            candidates.append(SurvivalArrival(settings.survival_level_window_steps, step_minutes, context))
        elif with_price or not settings.learned_need_price:
            candidates.append(learned[name](settings, len(fit), fit.period, with_price))
    return candidates
