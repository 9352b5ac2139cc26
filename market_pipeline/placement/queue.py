"""The waiting queue's rule when capacity frees up, one copy for the fleet's twin (the live
loop's embedded fleet) and the offline simulator: first in, first out, with backfill.

Freed room is offered to the waiting jobs oldest first. A job the room cannot take is passed
over, not waited on: jobs of one GPU shape differ in CPU and memory, so a large job at the head
must not keep smaller ones from room that would take them (a new arrival would take that room
at once). Each backend brings its own screen (`may_fit`, cheap: can the freed room hold this
job at all?) and its own placement (`place`, the policy's search; it starts the job and says
whether it did)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

Job = TypeVar("Job")


def backfill(
    waiting: Iterable[Job],
    may_fit: Callable[[Job], bool],
    place: Callable[[Job], bool],
    budget: int | None = None,
) -> int:
    """Offer freed room to `waiting`, in the order given (oldest first): a job `may_fit` rules
    out is skipped without a search; every other one is a placement attempt, at most `budget`
    of them (None: no limit). `waiting` must not be the list `place` removes jobs from (pass a
    copy or a sorted view). Returns how many jobs started."""
    attempts = started = 0
    for job in waiting:
        if budget is not None and attempts >= budget:
            break
        if not may_fit(job):
            continue
        attempts += 1
        if place(job):
            started += 1
    return started
