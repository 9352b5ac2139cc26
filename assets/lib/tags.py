"""Run tags the loop's runs carry, shared by the assets (which read them) and the schedules
and sensors (which set them)."""

from datetime import datetime, timezone

TICK_TAG = "market_pipeline/tick"  # ISO time (UTC) of the tick a run serves


def tick_tags(moment: datetime) -> dict[str, str]:
    return {TICK_TAG: moment.astimezone(timezone.utc).isoformat()}
