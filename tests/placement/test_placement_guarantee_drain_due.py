"""When a control step plans drains for a waiting guaranteed job (`placement.guarantee.
drain_due`): at the latest step from which the drains still end within its SLA wait, or at
once where it needs a whole node."""

from __future__ import annotations

import pytest

from market_pipeline.placement.guarantee import drain_after_seconds, drain_due


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
