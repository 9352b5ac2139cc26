"""Decisions are typed: the action is a `DecisionAction`, the kind a `DecisionKind`, and the
outcome an executor records a `DecisionOutcome`; the stored text is each one's value."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from market_pipeline import action_batches
from market_pipeline.scaling.types import Action
from market_pipeline.warehouse.decisions import (
    DecisionAction,
    DecisionKind,
    DecisionOutcome,
    DecisionRow,
    decisions_frame,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_an_actions_text_becomes_its_enum_and_is_stored_as_its_value() -> None:
    row = DecisionRow("d1", DecisionKind.SCALE, "power_on", T0, True, False, pool_id="p", target="n1")
    assert row.action is DecisionAction.POWER_ON
    frame = decisions_frame([row])
    assert frame["action"].to_list() == ["power_on"]
    assert str(frame.schema["action"]) == "String"


def test_an_unknown_action_is_a_defect_that_fails_before_anything_is_written() -> None:
    with pytest.raises(ValueError, match="launch_rocket"):
        DecisionRow("d1", DecisionKind.SCALE, "launch_rocket", T0, True, False)


def test_every_scaling_action_is_a_decision_action() -> None:
    assert set(Action.__args__) <= {a.value for a in DecisionAction}


def test_the_batch_outcomes_are_the_decision_outcomes() -> None:
    assert action_batches.FAILING_STATUSES == {
        DecisionOutcome.FAILED,
        DecisionOutcome.ERROR,
        DecisionOutcome.RUNNING,
    }
    assert action_batches.INFEASIBLE == "infeasible"  # the stored text is unchanged
    assert {action_batches.OK, action_batches.SKIPPED, action_batches.ABORTED} <= set(DecisionOutcome)
