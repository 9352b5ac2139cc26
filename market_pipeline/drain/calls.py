"""How the drain executor calls the adapter and tells time (both swappable for tests).

Every adapter call gets a deadline; a call that hangs or raises becomes a platform-fault
result of the step, never an exception that stops the drain half-way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from market_pipeline.hardware.protocol import Outcome, OutcomeStatus


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class AdvancingClock:
    """For a fleet that keeps its own time (the simulated twin): waiting moves the fleet's
    clock forward instead of sleeping, so the task sees its notice pass while the drain
    takes no wall time. Timestamps stay on the wall clock: the moment the clock was made,
    plus the time waited since. Only waiting moves it, never the wall time the drain's own
    work takes: a deadline read off a clock that also counted the wall time would shorten
    the last wait by however long the adapter calls happened to take, and the same drain
    would end the task a second earlier or later from run to run."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        self._advance = advance
        self._started = datetime.now(timezone.utc)
        self._waited = 0.0

    def now(self) -> datetime:
        return self._started + timedelta(seconds=self._waited)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._advance(seconds)
            self._waited += seconds


def clock_for(adapter: object) -> Clock:
    """The drain clock for ``adapter``: an advancing clock where the fleet can be moved
    forward (``advance`` and ``now``), the system clock otherwise."""
    advance, fleet_now = getattr(adapter, "advance", None), getattr(adapter, "now", None)
    if callable(advance) and callable(fleet_now):
        return AdvancingClock(lambda seconds: advance(fleet_now() + timedelta(seconds=seconds)))
    return SystemClock()


@dataclass(frozen=True)
class StepResult:
    status: str
    detail: str
    seconds: float
    platform_fault: bool  # the adapter hung, raised or answered nonsense

    def as_detail(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 4),
            "platform_fault": self.platform_fault,
        }


def _checked(result: object, seconds: float) -> StepResult:
    if not isinstance(result, Outcome):
        return StepResult(
            OutcomeStatus.FAILED.value,
            f"adapter returned {type(result).__name__}, not an Outcome",
            seconds,
            True,
        )
    return StepResult(result.status.value, result.detail, result.seconds or seconds, False)


class StepCaller(Protocol):
    def call(self, fn: Callable[[], Any], deadline_seconds: float) -> StepResult: ...


class ThreadedStepCaller:
    """Runs each adapter call on a daemon thread and stops waiting at its deadline.

    A call that never returns keeps its thread but blocks neither the drain nor the exit
    of the process (unlike a thread pool, whose workers are joined at exit).
    """

    def call(self, fn: Callable[[], Any], deadline_seconds: float) -> StepResult:
        started = time.monotonic()
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["result"] = fn()
            except BaseException as exc:  # handed to the drain's thread below
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=target, name="drain-adapter-call", daemon=True).start()
        if not done.wait(timeout=max(deadline_seconds, 0.01)):
            return StepResult(
                OutcomeStatus.TIMEOUT.value,
                f"adapter gave no answer within {deadline_seconds:.1f}s",
                time.monotonic() - started,
                True,
            )
        error = box.get("error")
        if error is not None:
            if not isinstance(error, Exception):
                raise error  # KeyboardInterrupt and friends stop the drain run itself
            return StepResult(
                OutcomeStatus.FAILED.value,
                f"{type(error).__name__}: {error}",
                time.monotonic() - started,
                True,
            )
        return _checked(box["result"], time.monotonic() - started)


class InlineStepCaller:
    """Calls the adapter on this thread (for adapters that bound their own calls, and tests)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def call(self, fn: Callable[[], Any], deadline_seconds: float) -> StepResult:
        started = self.clock.now()
        try:
            result = fn()
        except Exception as exc:
            seconds = (self.clock.now() - started).total_seconds()
            return StepResult(OutcomeStatus.FAILED.value, f"{type(exc).__name__}: {exc}", seconds, True)
        seconds = (self.clock.now() - started).total_seconds()
        if seconds > deadline_seconds:
            return StepResult(
                OutcomeStatus.TIMEOUT.value,
                f"adapter gave no answer within {deadline_seconds:.1f}s",
                seconds,
                True,
            )
        return _checked(result, seconds)
