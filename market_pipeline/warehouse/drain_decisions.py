"""The drain decisions in `decisions` (kind 'drain', `target` the task, the task's snapshot in
`inputs`): written once per id, read back for execution, planning limits and history."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from market_pipeline.warehouse.decisions import DecisionKind
from market_pipeline.warehouse.store import Warehouse

DECISION_COLUMNS = (
    "decision_id",
    "kind",
    "pool_id",
    "target",
    "action",
    "allowed",
    "shadow",
    "reasons",
    "inputs",
    "decided_at",
)
# What a drain decision is read back as (StoredDecision's fields, the task's in `inputs`).
STORED_COLUMNS = (
    "decision_id",
    "allowed",
    "shadow",
    "reasons",
    "inputs",
    "decided_at",
    "executed_at",
    "outcome",
)
_DRAIN = DecisionKind.DRAIN.value
_STORED_SQL = f"SELECT {', '.join(STORED_COLUMNS)} FROM decisions WHERE kind = ?"


def insert_new_decisions(warehouse: Warehouse, frame: pl.DataFrame) -> int:
    """Insert the frame's decisions (DECISION_SCHEMA); an id already present keeps its first
    version (a rerun of the same tick). Returns how many were new."""
    if frame.is_empty():
        return 0
    with warehouse.connect() as con:
        before = con.execute("SELECT count(*) FROM decisions").fetchone()[0]
        con.register("_drain_decisions", frame.to_arrow())
        try:
            warehouse.insert_new(
                con,
                "decisions",
                DECISION_COLUMNS,
                "SELECT decision_id, kind, pool_id, target, action, allowed, shadow, reasons,"
                " CAST(inputs AS JSON), decided_at FROM _drain_decisions",
            )
        finally:
            con.unregister("_drain_decisions")
        after = con.execute("SELECT count(*) FROM decisions").fetchone()[0]
    return int(after - before)


def stored_decision(warehouse: Warehouse, decision_id: str) -> tuple | None:
    """The drain decision (STORED_COLUMNS) with this id, if any."""
    with warehouse.connect() as con:
        return con.execute(_STORED_SQL + " AND decision_id = ?", [_DRAIN, decision_id]).fetchone()


def pending_decisions(warehouse: Warehouse) -> list[tuple]:
    """Approved, live, not yet executed drain decisions (STORED_COLUMNS), oldest first; read-only."""
    with warehouse.connect(read_only=True) as con:
        return con.execute(
            _STORED_SQL
            + " AND allowed AND NOT shadow AND executed_at IS NULL ORDER BY decided_at, decision_id",
            [_DRAIN],
        ).fetchall()


def mark_executed(warehouse: Warehouse, outcomes: Sequence[tuple[str, str]], at: datetime) -> None:
    """(decision id, outcome) pairs; a decision already executed keeps its first outcome."""
    for decision_id, outcome in outcomes:
        warehouse.execute(
            "UPDATE decisions SET executed_at = ?, outcome = ? WHERE decision_id = ? AND executed_at IS NULL",
            [at, outcome, decision_id],
        )


def ledger_rows(warehouse: Warehouse, shadow: bool, since: datetime) -> list[tuple]:
    """(decision id, task, tenant, pool, node, decided at, outcome) of the allowed drains of
    the mode (`shadow`) since `since`."""
    with warehouse.connect(read_only=True) as con:
        return con.execute(
            "SELECT decision_id, target, inputs->>'tenant_id', pool_id, inputs->>'node_id', "
            "decided_at, outcome FROM decisions WHERE kind = ? AND allowed "
            "AND shadow = ? AND decided_at >= ?",
            [_DRAIN, shadow, since],
        ).fetchall()


def outcome_counts(warehouse: Warehouse, outcomes: Sequence[str]) -> list[tuple]:
    """(task, tenant, outcome, drains) of the live drains that ended in one of `outcomes`."""
    with warehouse.connect(read_only=True) as con:
        return con.execute(
            "SELECT target, inputs->>'tenant_id', outcome, count(*) FROM decisions "
            "WHERE kind = ? AND NOT shadow AND list_contains(?, outcome) GROUP BY ALL",
            [_DRAIN, list(outcomes)],
        ).fetchall()


def allowed_decisions_between(
    warehouse: Warehouse, kind: str, action: str, with_shadow: bool, since: datetime, until: datetime
) -> list[tuple]:
    """Allowed decisions of `kind` and `action` made in [since, until] (live ones only unless
    `with_shadow`), oldest first: (decision_id, target, reasons, inputs, decided_at) tuples."""
    with warehouse.connect(read_only=True) as con:
        return con.execute(
            "SELECT decision_id, target, reasons, inputs, decided_at FROM decisions"
            " WHERE kind = ? AND action = ? AND allowed"
            " AND (NOT shadow OR ?) AND decided_at >= ? AND decided_at <= ?"
            " ORDER BY decided_at, decision_id",
            [kind, action, with_shadow, since, until],
        ).fetchall()
