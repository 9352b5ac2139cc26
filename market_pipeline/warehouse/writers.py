"""Writes beyond the store's generic append/replace/upsert: one function per statement, so
the assets hold no SQL."""

from __future__ import annotations

from datetime import datetime

from market_pipeline.warehouse.store import Warehouse


def close_unseen_tasks(store: Warehouse, observed_at: datetime) -> None:
    """Tasks the adapter no longer lists at `observed_at` ended when they were last seen."""
    store.execute("UPDATE tasks SET ended_at = last_seen_at, end_reason = 'not_seen' "
                  "WHERE ended_at IS NULL AND last_seen_at < ?", [observed_at])
