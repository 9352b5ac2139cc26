"""One row of the `decisions` table, for every kind of decision the loop records: prices
(shadow mode), scaling, task drains and budget guards.

Each producer builds `DecisionRow`s and the frame is made here, so the four kinds share one
schema: the columns of migration 1's `decisions` table that a decision sets when it is made
(`executed_at`, `outcome` and the batch claim columns are the executor's, left null).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import polars as pl

from market_pipeline.warehouse.decision_inputs import (
    BudgetGuardInputs,
    DecisionInputs,
    DrainInputs,
    PriceInputs,
    ScaleInputs,
)


class DecisionKind(StrEnum):
    PRICE = "price"
    SCALE = "scale"
    DRAIN = "drain"
    BUDGET_GUARD = "budget_guard"


class DecisionAction(StrEnum):
    """What a decision does; the stored `action` text is the value."""

    PUBLISH_PRICE = "publish_price"  # price: a tick's prices go to the price book
    SCALE_UP = "scale_up"  # scale: add a node (a cold boot)
    SCALE_DOWN = "scale_down"  # scale: remove an empty node
    POWER_ON = "power_on"  # scale: wake a warm standby node
    POWER_OFF = "power_off"  # scale: put an empty node on warm standby
    CORDON = "cordon"
    UNCORDON = "uncordon"
    HOLD = "hold"  # scale: keep the pool as it is (the reasons say why)
    REPLACE = "replace"  # scale: an unhealthy node is replaced, then drained
    DRAIN_TASK = "drain_task"  # drain: move one running task off its node
    REFUSE_NEW_TASKS = "refuse_new_tasks"  # budget guard: the tenant's balance is spent
    DRAIN = "drain"  # budget guard: drain one running task of that tenant


class DecisionOutcome(StrEnum):
    """What carrying a decision out came to; the stored `outcome` text is the value. Only
    FAILED, ERROR and RUNNING make a batch run fail; an action the fleet cannot carry out is
    INFEASIBLE, an outcome like any other."""

    OK = "ok"
    INFEASIBLE = "infeasible"  # no standby node, node gone, node still busy: nothing to do
    FAILED = "failed"  # the adapter tried and reported a failure
    ERROR = "error"  # the adapter raised
    SUPERSEDED = "superseded"  # a later plan re-decided before this batch ran
    ABANDONED = "abandoned"  # claimed by a run that died before recording an outcome
    SKIPPED = "skipped"  # executed before, or in flight in another run: not touched again
    RUNNING = "running"  # a drain that stopped before its end; a resume run continues it
    ABORTED = "aborted"  # a drain its protocol would not start (expired, the task moved)


# What each kind of decision is decided on (`decision_inputs`).
INPUTS_BY_KIND: dict[DecisionKind, type] = {
    DecisionKind.PRICE: PriceInputs,
    DecisionKind.SCALE: ScaleInputs,
    DecisionKind.DRAIN: DrainInputs,
    DecisionKind.BUDGET_GUARD: BudgetGuardInputs,
}

DECISION_SCHEMA: dict[str, pl.DataType] = {
    "decision_id": pl.Utf8(),
    "kind": pl.Utf8(),
    "pool_id": pl.Utf8(),
    "target": pl.Utf8(),
    "action": pl.Utf8(),
    "allowed": pl.Boolean(),
    "shadow": pl.Boolean(),
    "reasons": pl.List(pl.Utf8()),
    "inputs": pl.Utf8(),
    "decided_at": pl.Datetime("us", "UTC"),
}


@dataclass(frozen=True)
class DecisionRow:
    """A decision as recorded: what (`action` on `target` in `pool_id`), whether it was
    allowed, in shadow mode or not, why (`reasons`) and on what (`inputs`, its kind's
    dataclass, stored as JSON)."""

    decision_id: str
    kind: DecisionKind
    action: DecisionAction
    decided_at: datetime
    allowed: bool
    shadow: bool
    pool_id: str | None = None
    target: str | None = None
    reasons: tuple[str, ...] = ()
    inputs: DecisionInputs | None = None

    def __post_init__(self) -> None:
        # producers may pass the action's text (the scaling plan's literals): an unknown one
        # is a defect and fails here, before anything is written
        object.__setattr__(self, "kind", DecisionKind(self.kind))
        object.__setattr__(self, "action", DecisionAction(self.action))
        expected = INPUTS_BY_KIND[self.kind]
        if self.inputs is not None and not isinstance(self.inputs, expected):
            raise TypeError(
                f"decision {self.decision_id}: a {self.kind} decision's inputs are {expected.__name__},"
                f" not {type(self.inputs).__name__}"
            )

    def to_row(self) -> dict[str, Any]:
        """The row for `decisions`; `inputs` as JSON (values it cannot encode as their str)."""
        inputs = {} if self.inputs is None else self.inputs.to_json()
        return {
            "decision_id": self.decision_id,
            "kind": str(self.kind),
            "pool_id": self.pool_id,
            "target": self.target,
            "action": str(self.action),
            "allowed": self.allowed,
            "shadow": self.shadow,
            "reasons": list(self.reasons),
            "inputs": json.dumps(inputs, default=str),
            "decided_at": self.decided_at,
        }


def decisions_frame(rows: Iterable[DecisionRow]) -> pl.DataFrame:
    """Rows for the `decisions` table, in DECISION_SCHEMA (an empty frame keeps the schema)."""
    return pl.DataFrame([row.to_row() for row in rows], schema=DECISION_SCHEMA)
