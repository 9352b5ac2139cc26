"""One row of the `decisions` table, for every kind of decision the loop records: prices
(shadow mode), scaling, task drains and budget guards.

Each producer builds `DecisionRow`s and the frame is made here, so the four kinds share one
schema: the columns of migration 1's `decisions` table that a decision sets when it is made
(`executed_at`, `outcome` and the batch claim columns are the executor's, left null).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import polars as pl


class DecisionKind(StrEnum):
    PRICE = "price"
    SCALE = "scale"
    DRAIN = "drain"
    BUDGET_GUARD = "budget_guard"


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
    allowed, in shadow mode or not, why (`reasons`) and on what (`inputs`, stored as JSON)."""

    decision_id: str
    kind: DecisionKind
    action: str
    decided_at: datetime
    allowed: bool
    shadow: bool
    pool_id: str | None = None
    target: str | None = None
    reasons: tuple[str, ...] = ()
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """The row for `decisions`; `inputs` as JSON (values it cannot encode as their str)."""
        return {
            "decision_id": self.decision_id,
            "kind": str(self.kind),
            "pool_id": self.pool_id,
            "target": self.target,
            "action": self.action,
            "allowed": self.allowed,
            "shadow": self.shadow,
            "reasons": list(self.reasons),
            "inputs": json.dumps(dict(self.inputs), default=str),
            "decided_at": self.decided_at,
        }


def decisions_frame(rows: Iterable[DecisionRow]) -> pl.DataFrame:
    """Rows for the `decisions` table, in DECISION_SCHEMA (an empty frame keeps the schema)."""
    return pl.DataFrame([row.to_row() for row in rows], schema=DECISION_SCHEMA)
