"""The drains' audit tables: `drain_audit` (one row per transition of a drain's protocol) and
`drain_billing_events` (one row per finished drain, in the same transaction as its terminal
audit row). Rows in and out as the tables hold them; what a transition means is the drain
package's (`drain.protocol`, `drain.store`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import duckdb

from market_pipeline.warehouse.store import Warehouse, raise_unless_conflict, rollback

T = TypeVar("T")

AUDIT_COLUMNS = ("drain_id", "seq", "state", "recorded_at", "task_id", "node_id", "tenant_id", "detail")
BILLING_COLUMNS = (
    "drain_id",
    "decision_id",
    "task_id",
    "tenant_id",
    "pool_id",
    "node_id",
    "drain_signal_at",
    "grace_seconds",
    "task_ended_at",
    "outcome",
    "platform_fault",
    "reason",
    "recorded_at",
)
OUTCOME_COLUMNS = ("drain_id", "tenant_id", "outcome", "platform_fault", "reason", "seconds")


def audit_rows(con: duckdb.DuckDBPyConnection, drain_id: str) -> list[tuple]:
    """The drain's rows (AUDIT_COLUMNS), in sequence order."""
    return con.execute(
        f"SELECT {', '.join(AUDIT_COLUMNS)} FROM drain_audit WHERE drain_id = ? ORDER BY seq", [drain_id]
    ).fetchall()


def written_seqs(con: duckdb.DuckDBPyConnection, drain_id: str) -> set[int]:
    return {
        int(r[0])
        for r in con.execute("SELECT seq FROM drain_audit WHERE drain_id = ?", [drain_id]).fetchall()
    }


def seq_written(con: duckdb.DuckDBPyConnection, drain_id: str, seq: int) -> bool:
    """Whether (drain_id, seq) is written (a lake has no primary key to refuse a second one)."""
    row = con.execute(
        "SELECT count(*) FROM drain_audit WHERE drain_id = ? AND seq = ?", [drain_id, seq]
    ).fetchone()
    return bool(row and row[0])


def insert_audit_row(
    con: duckdb.DuckDBPyConnection,
    drain_id: str,
    seq: int,
    state: str,
    recorded_at: datetime,
    task_id: str | None,
    node_id: str | None,
    tenant_id: str | None,
    detail: Mapping[str, Any],
) -> None:
    """One row, inside the caller's transaction; the detail as JSON (values it cannot encode as
    their str)."""
    con.execute(
        f"INSERT INTO drain_audit ({', '.join(AUDIT_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            drain_id,
            seq,
            state,
            recorded_at,
            task_id,
            node_id,
            tenant_id,
            json.dumps(dict(detail), default=str),
        ],
    )


def requested_detail(con: duckdb.DuckDBPyConnection, drain_id: str) -> dict[str, Any]:
    """The detail of the drain's first (requested) row; empty when it has none."""
    row = con.execute("SELECT detail FROM drain_audit WHERE drain_id = ? AND seq = 0", [drain_id]).fetchone()
    return json.loads(row[0]) if row and row[0] else {}


def open_drain_ids(con: duckdb.DuckDBPyConnection, task_id: str, terminal_states: Sequence[str]) -> list[str]:
    """The task's drains that reached none of `terminal_states`."""
    rows = con.execute(
        "SELECT drain_id FROM drain_audit WHERE task_id = ? GROUP BY drain_id "
        "HAVING NOT bool_or(list_contains(?, state)) ORDER BY drain_id",
        [task_id, list(terminal_states)],
    ).fetchall()
    return [r[0] for r in rows]


def insert_billing_event(
    warehouse: Warehouse, con: duckdb.DuckDBPyConnection, billing: Mapping[str, Any]
) -> None:
    """A finished drain's billing event (BILLING_COLUMNS; one already there is kept)."""
    values = [billing.get(c) for c in BILLING_COLUMNS]
    placeholders = ", ".join("?" for _ in BILLING_COLUMNS)
    warehouse.insert_new(con, "drain_billing_events", BILLING_COLUMNS, f"VALUES ({placeholders})", values)


def recent_drain_outcomes(warehouse: Warehouse, since: datetime) -> list[dict[str, Any]]:
    """Finished drains since `since` (OUTCOME_COLUMNS): outcome, seconds from the drain's first
    row to its end, platform fault."""
    with warehouse.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT b.drain_id, b.tenant_id, b.outcome, b.platform_fault, b.reason, "
            "date_diff('millisecond', a.first_at, b.recorded_at) / 1000.0 AS seconds "
            "FROM drain_billing_events b JOIN (SELECT drain_id, min(recorded_at) AS first_at "
            "FROM drain_audit GROUP BY drain_id) a USING (drain_id) "
            "WHERE b.recorded_at >= ? ORDER BY b.recorded_at",
            [since],
        ).fetchall()
    return [dict(zip(OUTCOME_COLUMNS, row)) for row in rows]


def write_step(con: duckdb.DuckDBPyConnection, write: Callable[[], T]) -> T:
    """`write()` in one transaction on `con`: on a DuckDB error (a failed COMMIT included) it is
    rolled back and the error propagates; any other error propagates as it is."""
    con.execute("BEGIN")
    try:
        result = write()
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
    return result


def mirror_steps(warehouse: Warehouse, write: Callable[[duckdb.DuckDBPyConnection], None], what: str) -> None:
    """`write(con)` in one transaction on a new connection: on a DuckDB error it is rolled
    back, and a lake's lost commit propagates as it is (for `Warehouse.retrying`), anything
    else as one WarehouseError line, `what` first."""
    with warehouse.connect() as con:
        con.execute("BEGIN")
        try:
            write(con)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            rollback(con)
            raise_unless_conflict(exc, what)
