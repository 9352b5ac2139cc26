"""When a control step plans drains for a waiting guaranteed job (`placement.guarantee.
drain_due`): at the latest step from which the drains still end within its SLA wait, or at
once where it needs a whole node."""

from __future__ import annotations

import pytest

from market_pipeline.placement.guarantee import drain_after_seconds, drain_due, drain_order


def test_drains_wait_until_a_step_later_would_be_too_late() -> None:
    # SLA wait 600 s, a drain of 30 + 60 + 30 s, steps every 300 s: a job planned for at 180 s
    # of waiting or later still starts by 180 + 300 + 120 = 600 s if the step after is the one
    assert drain_after_seconds(600.0, 120.0, 300.0) == 180.0
    assert drain_after_seconds(300.0, 120.0, 300.0) == 0.0  # no step to spare: at once
    assert not drain_due(179.0, 1, 8, 180.0)
    assert drain_due(180.0, 1, 8, 180.0)
    assert drain_due(0.0, 1, 8, 0.0)  # `drain_at_latest_step` off: the first step


@pytest.mark.parametrize(
    ("num_gpu", "largest", "due"), [(8, 8, True), (4, 8, False), (4, 4, True), (1, 0, False)]
)
def test_a_job_that_needs_a_whole_node_is_drained_for_at_once(num_gpu: int, largest: int, due: bool) -> None:
    assert drain_due(10.0, num_gpu, largest, 180.0) is due


# SLA wait 600 s less a 120 s drain: drains planned now still start a job that has waited 480 s
IN_TIME_S = 480.0
WAITED = [7200.0, 3600.0, 450.0, 200.0]  # oldest first: two hours late, one hour late, two in time


def test_oldest_first_plans_every_due_job_in_the_order_given() -> None:
    assert drain_order(WAITED, IN_TIME_S, "oldest_first") == [0, 1, 2, 3]


def test_after_in_time_plans_the_jobs_a_drain_can_still_start_in_time_first() -> None:
    assert drain_order(WAITED, IN_TIME_S, "after_in_time") == [2, 3, 0, 1]
    assert drain_order([480.0, 481.0], IN_TIME_S, "after_in_time") == [0, 1]  # 480 s: still in time


def test_never_plans_no_drain_for_a_job_already_late() -> None:
    assert drain_order(WAITED, IN_TIME_S, "never") == [2, 3]
    assert drain_order([900.0], IN_TIME_S, "never") == []
