"""Per-key rate limits: one token bucket per API key, in memory (one service process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    def __init__(self, per_second: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.burst = float(burst)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, at)
        self._lock = threading.Lock()

    def allow(self, key_id: str) -> tuple[bool, float]:
        """(allowed, seconds until the next token when refused)."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(key_id, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.per_second)
            if tokens >= 1.0:
                self._buckets[key_id] = (tokens - 1.0, now)
                return True, 0.0
            self._buckets[key_id] = (tokens, now)
            return False, (1.0 - tokens) / self.per_second
