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
from market_pipeline.warehouse import Warehouse, WarehouseError
from market_pipeline.warehouse.control import ControlConflict
from market_pipeline.warehouse.decision_inputs import DrainInputs
from market_pipeline.warehouse.drain_audit import (
    audit_rows,
    insert_audit_row,
    insert_billing_event,
    mirror_steps,
    open_drain_ids,
    requested_detail,
    seq_written,
    write_step,
    written_seqs,
)
from market_pipeline.warehouse.drain_decisions import (
    insert_new_decisions,
    ledger_rows,
    mark_executed,
    outcome_counts,
    pending_decisions,
    stored_decision,
)
from market_pipeline.warehouse.drain_outbox import DrainWarning, write_drain_warning
from market_pipeline.warehouse.notice_outbox import NoticeOutbox, notices_path

TERMINAL_VALUES = tuple(s.value for s in TERMINAL_STATES)


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
            rows = audit_rows(con, drain_id)
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

            def write() -> DrainWarning | None:
                if self.warehouse.lake is not None and seq_written(con, transition.drain_id, transition.seq):
                    raise duckdb.ConstraintException("drain_audit key (drain_id, seq) exists")
                return _write_row(self.warehouse, con, transition)

            try:
                warning = write_step(con, write)
            except duckdb.ConstraintException as exc:
                raise DuplicateStepError(
                    f"drain {transition.drain_id}: seq {transition.seq} already written"
                ) from exc
            except duckdb.Error as exc:
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

        def rows(con: duckdb.DuckDBPyConnection) -> None:
            have = written_seqs(con, history[0].drain_id)
            for transition in history:
                if transition.seq not in have:
                    warning = _write_row(self.warehouse, con, transition)
                    if warning is not None:
                        warnings.append(warning)

        def write() -> None:
            warnings.clear()  # a retried write starts over
            mirror_steps(
                self.warehouse, rows, f"mirroring drain {history[0].drain_id} into drain_audit failed"
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
            return control.open_drain_ids(task_id, list(TERMINAL_VALUES))
        with self._connect() as con:
            return open_drain_ids(con, task_id, TERMINAL_VALUES)


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
    insert_audit_row(
        con,
        transition.drain_id,
        transition.seq,
        transition.state.value,
        transition.recorded_at,
        transition.task_id,
        transition.node_id,
        transition.tenant_id,
        transition.detail,
    )
    billing = transition.detail.get("billing")
    if transition.state in TERMINAL_STATES and billing is not None:
        insert_billing_event(warehouse, con, billing)
    if transition.state is DrainState.WARNED and transition.phase is Phase.BEGIN:
        return _outbox_warning(con, transition)
    return None


def _outbox_warning(con: duckdb.DuckDBPyConnection, warned: DrainTransition) -> DrainWarning:
    requested = requested_detail(con, warned.drain_id)
    warning = drain_warning(requested, warned)
    write_drain_warning(con, warning)
    return warning


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
    return insert_new_decisions(warehouse, decisions_frame(decisions))


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
    row = stored_decision(warehouse, decision_id)
    if row is None:
        raise DecisionNotFound(f"no drain decision with id {decision_id!r}")
    return _stored(row)


def pending_drain_decisions(warehouse: Warehouse) -> list[StoredDecision]:
    """Approved, live (not shadow), not yet executed drain decisions; read-only."""
    if not warehouse.exists():
        return []
    return [_stored(r) for r in pending_decisions(warehouse)]


def mark_decision_executed(warehouse: Warehouse, report: DrainReport, at: datetime) -> None:
    """Record the drain's outcome on its decision (idempotent: first write wins)."""
    if report.decision_id is None:
        return
    pairs = [(report.decision_id, report.outcome)]
    if warehouse.control is not None:  # the control PostgreSQL keeps the first outcome
        pairs = warehouse.control.record_outcomes(pairs, at)
    mark_executed(warehouse, pairs, at)


def load_ledger(warehouse: Warehouse, shadow: bool, since: datetime) -> DrainLedger:
    rows = ledger_rows(warehouse, shadow, since)
    return DrainLedger(
        [
            LedgerEntry(d, t, tenant or "", pool or "", node or "", _utc(at), out)
            for d, t, tenant, pool, node, at, out in rows
        ]
    )


# The outcomes a task's drain history counts: answered, ignored (killed) and failed drains.
HISTORY_OUTCOMES = ("terminated", "killed", "failed")


def load_history(warehouse: Warehouse) -> tuple[dict[str, DrainHistory], dict[str, DrainHistory]]:
    """Past drain outcomes per task and per tenant (live drains only)."""
    rows = outcome_counts(warehouse, HISTORY_OUTCOMES)
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


def ledger_window_start(now: datetime, ttl_seconds: float) -> datetime:
    return now - max(timedelta(hours=24), timedelta(seconds=ttl_seconds))
