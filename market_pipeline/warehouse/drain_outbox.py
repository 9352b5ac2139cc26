"""The drain warning outbox: what the drain path writes when a warning step begins, and what
the webhook delivery worker reads back (migration 210, `drain_warning_outbox`).

The row is written in the same transaction as the warning's begin row of `drain_audit`, so a
warning that happened always has its outbox row and the drain itself never talks to a
receiver. A drain warns once (its protocol refuses a second warning), and `drain_id` is
unique, so a resumed run adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import duckdb
import polars as pl

from market_pipeline.warehouse.store import Warehouse


@dataclass(frozen=True)
class DrainWarning:
    drain_id: str
    decision_id: str | None
    tenant_id: str
    task_id: str
    node_id: str | None
    pool_id: str | None
    warned_at: datetime
    notice_seconds: float
    expected_drain_at: datetime
    reasons: tuple[str, ...]
    longer_notice: str
    outbox_id: int = 0  # assigned by the table

    def payload(self) -> dict[str, object]:
        """The JSON body a receiver gets (times in ISO 8601 UTC)."""
        return {
            "event": "drain.warning",
            "notice_id": f"drain-warning:{self.drain_id}",
            "drain_id": self.drain_id,
            "tenant_id": self.tenant_id,
            "task_id": self.task_id,
            "node_id": self.node_id,
            "pool_id": self.pool_id,
            "warned_at": self.warned_at.isoformat(),
            "notice_seconds": self.notice_seconds,
            "expected_drain_at": self.expected_drain_at.isoformat(),
            "reasons": list(self.reasons),
            "how_to_get_a_longer_notice": self.longer_notice,
        }


_COLUMNS = (
    "drain_id, decision_id, tenant_id, task_id, node_id, pool_id, warned_at, notice_seconds,"
    " expected_drain_at, reasons, longer_notice"
)


def write_drain_warning(con: duckdb.DuckDBPyConnection, warning: DrainWarning) -> None:
    """Add the warning to the outbox on the caller's connection (inside its transaction), once
    per drain. The id is one past the largest, and a drain already there is skipped, in plain
    SQL: a DuckLake warehouse has no sequence and no ON CONFLICT (the drain's writes are one
    transaction, so two warnings of one drain never race)."""
    con.execute(
        f"INSERT INTO drain_warning_outbox (outbox_id, {_COLUMNS}) "
        "SELECT (SELECT coalesce(max(outbox_id), 0) + 1 FROM drain_warning_outbox), "
        "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
        "WHERE NOT EXISTS (SELECT 1 FROM drain_warning_outbox WHERE drain_id = ?)",
        [
            warning.drain_id,
            warning.decision_id,
            warning.tenant_id,
            warning.task_id,
            warning.node_id,
            warning.pool_id,
            warning.warned_at,
            warning.notice_seconds,
            warning.expected_drain_at,
            list(warning.reasons),
            warning.longer_notice,
            warning.drain_id,
        ],
    )


def _warning(row: Sequence[object]) -> DrainWarning:
    outbox_id, drain, decision, tenant, task, node, pool, warned, notice, expected, reasons, longer = row
    return DrainWarning(
        drain_id=str(drain),
        decision_id=decision,  # type: ignore[arg-type]
        tenant_id=str(tenant),
        task_id=str(task),
        node_id=node,  # type: ignore[arg-type]
        pool_id=pool,  # type: ignore[arg-type]
        warned_at=warned,  # type: ignore[arg-type]
        notice_seconds=float(notice),  # type: ignore[arg-type]
        expected_drain_at=expected,  # type: ignore[arg-type]
        reasons=tuple(reasons or ()),  # type: ignore[arg-type]
        longer_notice=str(longer),
        outbox_id=int(outbox_id),  # type: ignore[arg-type]
    )


def drain_warnings_after(
    con: duckdb.DuckDBPyConnection, outbox_id: int, limit: int = 500
) -> list[DrainWarning]:
    """Outbox rows past `outbox_id`, oldest first, at most `limit`."""
    rows = con.execute(
        f"SELECT outbox_id, {_COLUMNS} FROM drain_warning_outbox WHERE outbox_id > ?"
        " ORDER BY outbox_id LIMIT ?",
        [outbox_id, limit],
    ).fetchall()
    return [_warning(r) for r in rows]


def tenant_drain_warnings(store: Warehouse, tenant_id: str, limit: int = 500) -> list[DrainWarning]:
    """One tenant's drain notices, newest first."""
    with store.connect(read_only=True) as con:
        rows = con.execute(
            f"SELECT outbox_id, {_COLUMNS} FROM drain_warning_outbox WHERE tenant_id = ?"
            " ORDER BY outbox_id DESC LIMIT ?",
            [tenant_id, limit],
        ).fetchall()
    return [_warning(r) for r in rows]


def warning_times(store: Warehouse) -> pl.DataFrame:
    """Every drain warning in the outbox: drain_id, tenant_id, warned_at."""
    return store.query("SELECT drain_id, tenant_id, warned_at FROM drain_warning_outbox")
