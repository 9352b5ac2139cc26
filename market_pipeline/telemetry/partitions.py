"""Hourly telemetry partitions: keys in Dagster's hourly format, windows in UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

# Dagster's HourlyPartitionsDefinition default key format (partitions in UTC).
PARTITION_FORMAT = "%Y-%m-%d-%H:%M"
PARTITION_LENGTH = timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# The hours a partition may name: from the epoch to well past any fleet's life, so every window
# and its neighbours stay inside what datetime and the warehouse's timestamps hold.
FIRST_PARTITION = _EPOCH
LAST_PARTITION = datetime(2199, 12, 31, 23, tzinfo=timezone.utc)


class PartitionKeyError(ValueError):
    """A partition key that is not an hourly key of the form YYYY-MM-DD-HH:00."""


@dataclass(frozen=True)
class PartitionWindow:
    key: str
    start: datetime  # inclusive, UTC
    end: datetime  # exclusive, UTC

    def contains(self, ts: datetime) -> bool:
        return self.start <= ts < self.end


def partition_key_of(ts: datetime) -> str:
    """The key of the hour that contains `ts` (naive datetimes are taken as UTC)."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    hour = ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return hour.strftime(PARTITION_FORMAT)


def partition_key_of_hour(epoch_hour: int) -> str:
    """The key of the hour numbered `epoch_hour` since 1970-01-01T00:00Z."""
    return (_EPOCH + timedelta(hours=epoch_hour)).strftime(PARTITION_FORMAT)


def partition_window(key: str) -> PartitionWindow:
    try:
        start = datetime.strptime(key, PARTITION_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        raise PartitionKeyError(f"partition key {key!r} is not an hourly key like 2024-01-31-13:00") from None
    if start.minute or start.second:
        raise PartitionKeyError(f"partition key {key!r} does not start on the hour")
    if not FIRST_PARTITION <= start <= LAST_PARTITION:
        raise PartitionKeyError(
            f"partition key {key!r} is outside the hours telemetry can hold"
            f" ({FIRST_PARTITION:%Y-%m-%d} to {LAST_PARTITION:%Y-%m-%d})"
        )
    return PartitionWindow(key=key, start=start, end=start + PARTITION_LENGTH)
