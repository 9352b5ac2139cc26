"""The waiting queue's one rule (FIFO with backfill), shared by the fleet's twin and the simulator."""

from __future__ import annotations

from market_pipeline.placement.queue import backfill


def _room(free: int):
    """A freed node with `free` GPUs; a job is its GPU count."""
    room = {"free": free}
    tried: list[int] = []

    def may_fit(job: int) -> bool:
        return job <= room["free"]

    def place(job: int) -> bool:
        tried.append(job)
        room["free"] -= job
        return True

    return may_fit, place, tried, room


def test_a_large_job_at_the_head_does_not_keep_smaller_ones_from_the_room() -> None:
    may_fit, place, tried, room = _room(free=3)
    started = backfill([8, 2, 4, 1], may_fit, place)
    assert tried == [2, 1] and started == 2 and room["free"] == 0


def test_the_oldest_that_fits_goes_first() -> None:
    may_fit, place, tried, _ = _room(free=2)
    backfill([2, 1, 1], may_fit, place)
    assert tried == [2]  # the room is gone before the younger jobs


def test_the_budget_counts_searches_not_jobs_passed_over() -> None:
    may_fit, place, tried, _ = _room(free=10)
    started = backfill([20, 30, 1, 1, 1], may_fit, place, budget=2)
    assert tried == [1, 1] and started == 2


def test_a_failed_search_still_spends_the_budget_and_starts_nothing() -> None:
    searched: list[int] = []

    def place(job: int) -> bool:
        searched.append(job)
        return False

    assert backfill([1, 2, 3], lambda job: True, place, budget=2) == 0
    assert searched == [1, 2]
