"""Batches of approved actions: one per tick and kind (scaling actions, drains).

The sensors launch one run per batch; inside it each decision is claimed in the warehouse
(one conditional UPDATE, so two runs of the same batch cannot both take it) before it is
carried out, and its outcome is written on the decision. A decision is thus carried out at
most once, however often a batch is rerun.

A claim whose run died before it wrote an outcome is settled by the next run of the batch:
a drain is taken over and resumed (its protocol continues from the audit log without
repeating a step); a scaling action is recorded as abandoned, since it may have been half
done and the next plan re-decides from the fleet anyway.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from market_pipeline.warehouse import Warehouse, WarehouseError

# Result statuses. Only FAILED, ERROR and RUNNING make a batch run fail; an action the fleet
# cannot carry out is INFEASIBLE, an outcome like any other.
OK = "ok"
INFEASIBLE = "infeasible"  # no standby node, node gone, node still busy: nothing to do
FAILED = "failed"  # the adapter tried and reported a failure
ERROR = "error"  # the adapter raised
SUPERSEDED = "superseded"  # a later plan re-decided before this batch ran
ABANDONED = "abandoned"  # claimed by a run that died before recording an outcome
SKIPPED = "skipped"  # executed before, or in flight in another run: not touched again
RUNNING = "running"  # a drain that stopped before its end; a resume run continues it
ABORTED = "aborted"  # a drain its protocol would not start (expired, the task moved)
FAILING_STATUSES = frozenset({FAILED, ERROR, RUNNING})

_BATCH_COLUMNS = "decision_id, action, pool_id, target, inputs, executed_at, outcome, claimed_by"
_ACTION_FILTER = "AND list_contains(?, action)"


@dataclass(frozen=True)
class ActionBatch:
    """Approved, live decisions of one kind sharing one tick (their `decided_at`)."""

    kind: str
    tick: datetime
    decision_ids: tuple[str, ...]

    @property
    def batch_id(self) -> str:
        return batch_id_for(self.kind, self.tick)


@dataclass(frozen=True)
class ActionResult:
    decision_id: str
    action: str
    target: str
    status: str
    detail: str

    @property
    def outcome(self) -> str:
        """As written to decisions.outcome."""
        return f"{self.status}: {self.detail}"


def batch_id_for(kind: str, tick: datetime) -> str:
    return f"{kind}@{_utc(tick).isoformat()}"


def parse_tick(text: str) -> datetime:
    """The ISO tick of a batch's run config; a bad one is one clear line."""
    try:
        tick = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"batch tick {text!r} is not an ISO timestamp") from None
    return _utc(tick)


def pending_batches(store: Warehouse, kind: str, actions: Sequence[str] | None = None) -> list[ActionBatch]:
    """Batches holding an approved, live decision without an outcome yet, oldest first.

    A decision claimed by a run that has not recorded its outcome stays pending, so that a
    resume run can settle it. Read-only.
    """
    if not store.path.exists():
        return []
    frame = store.query(
        "SELECT decided_at, list(decision_id ORDER BY decision_id) AS ids FROM decisions "
        "WHERE kind = ? AND allowed AND NOT shadow AND executed_at IS NULL "
        f"{_ACTION_FILTER if actions is not None else ''} GROUP BY decided_at ORDER BY decided_at",
        [kind, *([list(actions)] if actions is not None else [])])
    return [ActionBatch(kind, _utc(row["decided_at"]), tuple(row["ids"])) for row in frame.iter_rows(named=True)]


def batch_rows(store: Warehouse, kind: str, tick: datetime,
               actions: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every approved, live decision of the batch, executed or not, in decision-id order."""
    frame = store.query(
        f"SELECT {_BATCH_COLUMNS} FROM decisions WHERE kind = ? AND allowed AND NOT shadow "
        f"AND decided_at = ? {_ACTION_FILTER if actions is not None else ''} ORDER BY decision_id",
        [kind, tick, *([list(actions)] if actions is not None else [])])
    return frame.to_dicts()


def claim(store: Warehouse, decision_id: str, batch_id: str, run_id: str, now: datetime,
          take_over: str | None = None) -> bool:
    """Take the decision for `run_id`; False when it is executed or another run holds it.

    `take_over` names a dead run whose claim may be replaced (a drain being resumed).
    """
    with store.connect() as con:
        try:
            taken = con.execute(
                "UPDATE decisions SET claimed_by = ?, claimed_at = ?, batch_id = ? "
                "WHERE decision_id = ? AND executed_at IS NULL "
                "AND (claimed_by IS NULL OR claimed_by = ?) RETURNING decision_id",
                [run_id, now, batch_id, decision_id, take_over or run_id]).fetchall()
        except Exception as exc:  # duckdb.Error; named in the message
            raise WarehouseError(f"claiming decision {decision_id} failed: {exc}") from exc
    return bool(taken)


def record_outcome(store: Warehouse, decision_id: str, now: datetime, outcome: str) -> None:
    """Write the outcome once (a decision already executed keeps its first one)."""
    store.execute("UPDATE decisions SET executed_at = ?, outcome = ? WHERE decision_id = ? "
                  "AND executed_at IS NULL", [now, outcome, decision_id])


def carry_out(store: Warehouse, rows: Sequence[dict[str, Any]], *, batch_id: str, run_id: str,
              now: datetime, run_is_live: Callable[[str], bool], resumable: bool,
              act: Callable[[dict[str, Any]], ActionResult]) -> list[ActionResult]:
    """Claim and carry out each decision of a batch once; return what happened to each.

    `act` carries one claimed decision out and records its outcome; an exception from it
    (warehouse, adapter) ends the batch: the claim stays, and the next run settles it.
    """
    results = []
    for row in rows:
        decision_id, holder = row["decision_id"], row["claimed_by"]
        if row["executed_at"] is not None:
            results.append(result_for(row, SKIPPED, f"executed before: {row['outcome']}"))
            continue
        if holder is not None and holder != run_id and run_is_live(holder):
            results.append(result_for(row, SKIPPED, f"in flight in run {holder}"))
            continue
        if holder is not None and not resumable:
            result = result_for(row, ABANDONED, f"run {holder} stopped before recording an outcome; "
                                             "the next plan re-decides from the fleet")
            record_outcome(store, decision_id, now, result.outcome)
            results.append(result)
            continue
        if not claim(store, decision_id, batch_id, run_id, now, take_over=holder):
            results.append(result_for(row, SKIPPED, "claimed by another run meanwhile"))
            continue
        results.append(act(row))
    return results


def counts_by_status(results: Sequence[ActionResult]) -> dict[str, int]:
    return dict(sorted(Counter(r.status for r in results).items()))


def failing(results: Sequence[ActionResult]) -> list[ActionResult]:
    return [r for r in results if r.status in FAILING_STATUSES]


def result_for(row: dict[str, Any], status: str, detail: str) -> ActionResult:
    """What happened to one decision row of a batch."""
    return ActionResult(row["decision_id"], row["action"], row["target"] or "", status, detail)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
