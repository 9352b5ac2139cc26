"""Warehouse side of task drains: the audit store, drain decisions and the billing events.

Tables (DDL in warehouse/schema.py): `drain_audit` (one row per transition), `decisions`
(kind = 'drain'; `target` = task id; `outcome` set when the drain finished) and
`drain_billing_events` (migration 200; one row per finished drain, same transaction as
its terminal audit row).

On the cluster profile (`warehouse.control`), a step is written first to the control
PostgreSQL's `drain_journal`, whose primary key `(drain_id, seq)` refuses a second writer's
step; a drain resumes from there, and `drain_audit` (with its billing event and outbox row)
mirrors every journal row it lacks, so a crash between the two writes loses nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import duckdb

from market_pipeline.drain.lease import transition_from_dict, transition_to_dict
from market_pipeline.drain.limits import DrainLedger, LedgerEntry
from market_pipeline.drain.plan import DrainDecision, decisions_frame
from market_pipeline.drain.protocol import (
    TERMINAL_STATES,
    DrainState,
    DrainTransition,
    DuplicateStepError,
    Phase,
    task_from_dict,
)
from market_pipeline.drain.score import DrainHistory
from market_pipeline.drain.steps import DrainReport
from market_pipeline.hardware.protocol import TaskInfo
from market_pipeline.warehouse import Warehouse, WarehouseError, raise_unless_conflict, rollback
from market_pipeline.warehouse.control import ControlConflict
from market_pipeline.warehouse.decision_inputs import DrainInputs
from market_pipeline.warehouse.drain_outbox import DrainWarning, write_drain_warning
from market_pipeline.warehouse.notice_outbox import NoticeOutbox, notices_path

TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in TERMINAL_STATES)
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


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(timezone.utc) if value is not None else None


class WarehouseAuditStore:
    """DrainAuditStore over the DuckDB `drain_audit` table.

    By default each call opens its own short connection, so readers (the sensor) and
    other writers get the file between steps; pass `connection` to hold one open for a
    short drain where per-call opens would eat into the task's notice (the CLI).
    """

    def __init__(self, warehouse: Warehouse, connection: duckdb.DuckDBPyConnection | None = None) -> None:
        self.warehouse = warehouse
        self._connection = connection

    @contextlib.contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._connection is not None:
            yield self._connection
        else:
            with self.warehouse.connect() as con:
                yield con

    def load_states(self, drain_id: str) -> list[DrainTransition]:
        control = self.warehouse.control
        if control is not None and self._connection is None:
            history = [transition_from_dict(row) for row in control.drain_steps(drain_id)]
            self._mirror(history)
            return history
        with self._connect() as con:
            rows = con.execute(
                "SELECT drain_id, seq, state, recorded_at, task_id, node_id, tenant_id, detail "
                "FROM drain_audit WHERE drain_id = ? ORDER BY seq",
                [drain_id],
            ).fetchall()
        history = []
        for drain, seq, state, at, task, node, tenant, detail in rows:
            data = json.loads(detail) if detail else {}
            history.append(
                DrainTransition(
                    drain,
                    int(seq),
                    DrainState(state),
                    Phase(data.get("phase", Phase.ONLY.value)),
                    _utc(at),
                    task,
                    node,
                    tenant,
                    data,
                )
            )
        return history

    def append(self, transition: DrainTransition) -> None:
        control = self.warehouse.control
        if control is not None and self._connection is None:
            try:
                control.append_step(transition_to_dict(transition))
            except ControlConflict as exc:
                raise DuplicateStepError(str(exc)) from None
            rows = control.drain_steps(transition.drain_id)
            self._mirror([transition_from_dict(row) for row in rows])
            return
        with self._mirror_lock(), self._connect() as con:
            con.execute("BEGIN")
            try:
                if self.warehouse.lake is not None and _seq_taken(con, transition):
                    raise duckdb.ConstraintException("drain_audit key (drain_id, seq) exists")
                warning = _write_row(self.warehouse, con, transition)
                con.execute("COMMIT")
            except duckdb.ConstraintException as exc:
                con.execute("ROLLBACK")
                raise DuplicateStepError(
                    f"drain {transition.drain_id}: seq {transition.seq} already written"
                ) from exc
            except duckdb.Error as exc:
                con.execute("ROLLBACK")
                raise WarehouseError(f"append to drain_audit failed: {exc}") from exc
        self._notify([warning] if warning is not None else [])

    def _notify(self, warnings: Sequence[DrainWarning]) -> None:
        """Committed warnings to the notice file beside the warehouse file (its own lock, not
        the warehouse's), which wakes the webhook worker; a DuckLake warehouse has none."""
        if not warnings or self.warehouse.lake is not None:
            return
        outbox = NoticeOutbox(notices_path(self.warehouse.path))
        for warning in warnings:
            outbox.put(warning)

    def _mirror(self, history: Sequence[DrainTransition]) -> None:
        """Write into `drain_audit` (with billing event and outbox row) the journal rows it
        lacks, in one transaction, retried when it loses to a concurrent writer."""
        if not history:
            return

        warnings: list[DrainWarning] = []

        def write() -> None:
            warnings.clear()  # a retried write starts over
            with self.warehouse.connect() as con:
                con.execute("BEGIN")
                try:
                    have = {
                        int(r[0])
                        for r in con.execute(
                            "SELECT seq FROM drain_audit WHERE drain_id = ?", [history[0].drain_id]
                        ).fetchall()
                    }
                    for transition in history:
                        if transition.seq not in have:
                            warning = _write_row(self.warehouse, con, transition)
                            if warning is not None:
                                warnings.append(warning)
                    con.execute("COMMIT")
                except duckdb.Error as exc:
                    rollback(con)
                    raise_unless_conflict(
                        exc, f"mirroring drain {history[0].drain_id} into drain_audit failed"
                    )

        with self._mirror_lock():
            self.warehouse.retrying(write)
        self._notify(warnings)

    def _mirror_lock(self) -> contextlib.AbstractContextManager[None]:
        """On a lake, one writer at a time of the drain's tables: the outbox's id is one past the
        largest, so two drains warning at once must not both take it, and the ids must be in
        commit order (the webhook worker reads past the last id it saw). A caller's connection
        is its own transaction."""
        if self._connection is not None:
            return contextlib.nullcontext()
        return self.warehouse.write_lock("drain_audit", "drain_warning_outbox", "drain_billing_events")

    def open_drain_ids(self, task_id: str) -> list[str]:
        control = self.warehouse.control
        if control is not None and self._connection is None:
            return control.open_drain_ids(task_id, [s.value for s in TERMINAL_STATES])
        with self._connect() as con:
            rows = con.execute(
                "SELECT drain_id FROM drain_audit WHERE task_id = ? GROUP BY drain_id "
                f"HAVING NOT bool_or(state IN ({TERMINAL_SQL})) ORDER BY drain_id",
                [task_id],
            ).fetchall()
        return [r[0] for r in rows]


def drain_warning(requested: dict[str, Any], warned: DrainTransition) -> DrainWarning:
    """The outbox row of a warning that begins: the drain's task, reasons and notice (from its
    requested row) and when it is expected to be drained (the warning plus its notice)."""
    task = requested.get("task", {})
    timing = requested.get("timing", {})
    notice = float(warned.detail.get("notice_seconds", 0.0))
    checkpoint = float(timing.get("checkpoint_timeout_seconds", 0.0))
    warn = float(timing.get("warn_seconds", 0.0))
    if task.get("checkpointable"):
        longer = (
            f"this task has the checkpoint notice ({checkpoint:g} s); run drain-sensitive work in the"
            " guaranteed class, which is not drained for a cheaper price"
        )
    else:
        longer = (
            f"declare the task checkpointable: a checkpointable task gets {checkpoint:g} s to checkpoint"
            f" instead of a {warn:g} s warning"
        )
    if any(str(r).startswith("budget") for r in requested.get("reasons", [])):
        longer += "; top up the balance or raise the hard cap to stop budget drains"
    return DrainWarning(
        drain_id=warned.drain_id,
        decision_id=requested.get("decision_id"),
        tenant_id=str(warned.tenant_id or task.get("tenant_id") or ""),
        task_id=str(warned.task_id or task.get("task_id") or ""),
        node_id=warned.node_id or task.get("node_id"),
        pool_id=task.get("pool_id"),
        warned_at=warned.recorded_at,
        notice_seconds=notice,
        expected_drain_at=warned.recorded_at + timedelta(seconds=notice),
        reasons=tuple(str(r) for r in requested.get("reasons", [])),
        longer_notice=longer,
    )


def _write_row(
    warehouse: Warehouse, con: duckdb.DuckDBPyConnection, transition: DrainTransition
) -> DrainWarning | None:
    """One `drain_audit` row, with the billing event of a terminal one and the outbox row of a
    warning that begins (inside the caller's transaction); returns that warning, if any."""
    con.execute(
        "INSERT INTO drain_audit (drain_id, seq, state, recorded_at, task_id, "
        "node_id, tenant_id, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            transition.drain_id,
            transition.seq,
            transition.state.value,
            transition.recorded_at,
            transition.task_id,
            transition.node_id,
            transition.tenant_id,
            json.dumps(dict(transition.detail), default=str),
        ],
    )
    billing = transition.detail.get("billing")
    if transition.state in TERMINAL_STATES and billing is not None:
        _insert_billing(warehouse, con, billing)
    if transition.state is DrainState.WARNED and transition.phase is Phase.BEGIN:
        return _outbox_warning(con, transition)
    return None


def _outbox_warning(con: duckdb.DuckDBPyConnection, warned: DrainTransition) -> DrainWarning:
    row = con.execute(
        "SELECT detail FROM drain_audit WHERE drain_id = ? AND seq = 0", [warned.drain_id]
    ).fetchone()
    requested = json.loads(row[0]) if row and row[0] else {}
    warning = drain_warning(requested, warned)
    write_drain_warning(con, warning)
    return warning


def _seq_taken(con: duckdb.DuckDBPyConnection, transition: DrainTransition) -> bool:
    """Whether the transition's (drain_id, seq) is written (a lake has no primary key to refuse it)."""
    row = con.execute(
        "SELECT count(*) FROM drain_audit WHERE drain_id = ? AND seq = ?",
        [transition.drain_id, transition.seq],
    ).fetchone()
    return bool(row and row[0])


def _insert_billing(warehouse: Warehouse, con: duckdb.DuckDBPyConnection, billing: dict[str, Any]) -> None:
    values = [billing.get(c) for c in BILLING_COLUMNS]
    placeholders = ", ".join("?" for _ in BILLING_COLUMNS)
    warehouse.insert_new(con, "drain_billing_events", BILLING_COLUMNS, f"VALUES ({placeholders})", values)


# -- drain decisions ---------------------------------------------------------------------


@dataclass(frozen=True)
class StoredDecision:
    decision_id: str
    task: TaskInfo
    allowed: bool
    shadow: bool
    reasons: tuple[str, ...]
    decided_at: datetime
    executed_at: datetime | None
    outcome: str | None


class DecisionNotFound(ValueError):
    """No drain decision with this id; names it."""


def write_decisions(warehouse: Warehouse, decisions: Sequence[DrainDecision]) -> int:
    """Insert new decisions; an id already present keeps its first version (same tick rerun)."""
    frame = decisions_frame(decisions)
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
_DECISION_SQL = (
    "SELECT decision_id, allowed, shadow, reasons, inputs, decided_at, executed_at,"
    " outcome FROM decisions WHERE kind = 'drain'"
)


def _stored(row: tuple) -> StoredDecision:
    decision_id, allowed, shadow, reasons, inputs, decided, executed, outcome = row
    task = DrainInputs.stored_task(inputs)
    if task is None:
        raise DecisionNotFound(f"decision {decision_id} carries no task snapshot in inputs")
    return StoredDecision(
        decision_id,
        task_from_dict(task),
        bool(allowed),
        bool(shadow),
        tuple(reasons or ()),
        _utc(decided),
        _utc(executed),
        outcome,
    )


def load_decision(warehouse: Warehouse, decision_id: str) -> StoredDecision:
    with warehouse.connect() as con:
        row = con.execute(_DECISION_SQL + " AND decision_id = ?", [decision_id]).fetchone()
    if row is None:
        raise DecisionNotFound(f"no drain decision with id {decision_id!r}")
    return _stored(row)


def pending_drain_decisions(warehouse: Warehouse) -> list[StoredDecision]:
    """Approved, live (not shadow), not yet executed drain decisions; read-only."""
    if not warehouse.exists():
        return []
    with warehouse.connect(read_only=True) as con:
        rows = con.execute(
            _DECISION_SQL + " AND allowed AND NOT shadow AND executed_at IS NULL"
            " ORDER BY decided_at, decision_id"
        ).fetchall()
    return [_stored(r) for r in rows]


def mark_decision_executed(warehouse: Warehouse, report: DrainReport, at: datetime) -> None:
    """Record the drain's outcome on its decision (idempotent: first write wins)."""
    if report.decision_id is None:
        return
    pairs = [(report.decision_id, report.outcome)]
    if warehouse.control is not None:  # the control PostgreSQL keeps the first outcome
        pairs = warehouse.control.record_outcomes(pairs, at)
    for decision_id, outcome in pairs:
        warehouse.execute(
            "UPDATE decisions SET executed_at = ?, outcome = ? WHERE decision_id = ? AND executed_at IS NULL",
            [at, outcome, decision_id],
        )


def load_ledger(warehouse: Warehouse, shadow: bool, since: datetime) -> DrainLedger:
    with warehouse.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT decision_id, target, inputs->>'tenant_id', pool_id, inputs->>'node_id', "
            "decided_at, outcome FROM decisions WHERE kind = 'drain' AND allowed "
            "AND shadow = ? AND decided_at >= ?",
            [shadow, since],
        ).fetchall()
    return DrainLedger(
        [
            LedgerEntry(d, t, tenant or "", pool or "", node or "", _utc(at), out)
            for d, t, tenant, pool, node, at, out in rows
        ]
    )


def load_history(warehouse: Warehouse) -> tuple[dict[str, DrainHistory], dict[str, DrainHistory]]:
    """Past drain outcomes per task and per tenant (live drains only)."""
    with warehouse.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT target, inputs->>'tenant_id', outcome, count(*) FROM decisions "
            "WHERE kind = 'drain' AND NOT shadow AND outcome IN ('terminated', 'killed', 'failed')"
            " GROUP BY ALL"
        ).fetchall()
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for task, tenant, outcome, n in rows:
        counts.setdefault((task, tenant or ""), {})[outcome] = int(n)
    by_task: dict[str, DrainHistory] = {}
    by_tenant: dict[str, list[int]] = {}
    for (task, tenant), c in counts.items():
        h = DrainHistory(c.get("terminated", 0), c.get("killed", 0), c.get("failed", 0))
        by_task[task] = h
        total = by_tenant.setdefault(tenant, [0, 0, 0])
        total[0] += h.answered
        total[1] += h.ignored
        total[2] += h.failed
    return by_task, {t: DrainHistory(*v) for t, v in by_tenant.items()}


def recent_drain_outcomes(warehouse: Warehouse, since: datetime) -> list[dict[str, Any]]:
    """Finished drains since `since`: outcome, seconds from signal to end, platform fault."""
    with warehouse.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT b.drain_id, b.tenant_id, b.outcome, b.platform_fault, b.reason, "
            "date_diff('millisecond', a.first_at, b.recorded_at) / 1000.0 AS seconds "
            "FROM drain_billing_events b JOIN (SELECT drain_id, min(recorded_at) AS first_at "
            "FROM drain_audit GROUP BY drain_id) a USING (drain_id) "
            "WHERE b.recorded_at >= ? ORDER BY b.recorded_at",
            [since],
        ).fetchall()
    keys = ("drain_id", "tenant_id", "outcome", "platform_fault", "reason", "seconds")
    return [dict(zip(keys, row)) for row in rows]


def table_exists(warehouse: Warehouse, name: str) -> bool:
    if not warehouse.exists():
        return False
    with warehouse.connect(read_only=True) as con:
        row = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
        ).fetchone()
    return bool(row and row[0])


def ledger_window_start(now: datetime, ttl_seconds: float) -> datetime:
    return now - max(timedelta(hours=24), timedelta(seconds=ttl_seconds))
