"""Decisions are typed: the action is a `DecisionAction`, the kind a `DecisionKind`, and the
outcome an executor records a `DecisionOutcome`; the stored text is each one's value."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from market_pipeline import action_batches
from market_pipeline.warehouse.decision_inputs import BudgetGuardInputs, DrainInputs, PriceInputs, ScaleInputs
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


def test_a_batch_result_carries_the_outcome_and_stores_its_text() -> None:
    row = {"decision_id": "d1", "action": "power_on", "target": "n1"}
    result = action_batches.result_for(row, DecisionOutcome.INFEASIBLE, "no standby node")
    assert result.action is DecisionAction.POWER_ON and result.status is DecisionOutcome.INFEASIBLE
    assert result.outcome == "infeasible: no standby node"  # the stored text is unchanged
    assert action_batches.counts_by_status([result]) == {"infeasible": 1}
    assert type(next(iter(action_batches.counts_by_status([result])))) is str  # Dagster metadata
    assert action_batches.failing([result]) == []
    failed = action_batches.result_for(row, DecisionOutcome.FAILED, "adapter refused")
    assert action_batches.failing([result, failed]) == [failed]


def test_a_stored_action_that_is_unknown_fails_when_read_back() -> None:
    with pytest.raises(ValueError, match="launch_rocket"):
        action_batches.result_for(
            {"decision_id": "d1", "action": "launch_rocket", "target": None}, DecisionOutcome.OK, ""
        )


def test_a_decisions_inputs_must_be_its_kinds() -> None:
    guard = BudgetGuardInputs(Decimal("-1"), None, Decimal("2"), T0)
    with pytest.raises(TypeError, match="ScaleInputs"):
        DecisionRow("d1", DecisionKind.SCALE, "power_on", T0, True, False, inputs=guard)


def test_each_kinds_inputs_read_back_as_written() -> None:
    guard = BudgetGuardInputs(Decimal("-1.5"), Decimal("3"), Decimal("2"), T0).for_tenant("t1")
    price = PriceInputs(Decimal("2.500000"), T0)
    drain = DrainInputs({"task_id": "x"}, "t1", "n1", "idle", 0.5, {"idle": 0.5}, 1.0, None, T0)
    for inputs in (guard, price, drain):
        assert type(inputs).from_json(json.dumps(inputs.to_json())) == inputs
    # stored keys and their order are the table's contract (readers use inputs->>'tenant_id')
    assert list(guard.to_json()) == ["balance", "available", "next_interval_cost", "drain_after", "tenant_id"]
    assert "tenant_id" not in BudgetGuardInputs(Decimal("0"), None, Decimal("0"), None).to_json()
    assert BudgetGuardInputs.from_json("{}").drain_after is None


def test_a_scaling_decisions_facts_are_named_and_stored_only_when_set() -> None:
    base = ScaleInputs(1.0, 2.0, 3.0, 0.0, 4, 4, 4, 1, 4, 1.0, 3.0, 3, 1, 0, 0, 0, 1, 8, True, ("ok",))
    with pytest.raises(TypeError, match="colour"):
        base.with_facts(colour="red")
    stored = base.with_facts(cost=2.0, saving=5.0).recorded(3, None).to_json()
    assert list(stored)[-4:] == ["saving", "cost", "count", "certificate_margin"]
    assert stored["certificate_margin"] is None and "to" not in stored
    assert ScaleInputs.from_json(json.dumps(stored)) == base.with_facts(cost=2.0, saving=5.0).recorded(
        3, None
    )
    assert ScaleInputs.stored_count(json.dumps(stored)) == 3 and ScaleInputs.stored_count(None) == 1
