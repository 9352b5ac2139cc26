"""Batches of approved actions: one per tick and kind (scaling actions, drains).

The sensors launch one run per batch; inside it the batch's decisions are claimed in the
warehouse (one conditional UPDATE, so two runs of the same batch cannot both take one) before
any is carried out, and each outcome is written on its decision. A decision is thus carried
out at most once, however often a batch is rerun.

On the cluster profile (`store.control`), the claim and the first outcome are taken in the
control PostgreSQL (`decision_claims`, primary key the decision): that is the authority, and
the warehouse's `decisions` row mirrors it for readers.

A claim whose run died before it wrote an outcome is settled by the next run of the batch:
a drain is taken over and resumed (its protocol continues from the audit log without
repeating a step); a scaling action is recorded as abandoned, since it may have been half
done and the next plan re-decides from the fleet anyway.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from market_pipeline.warehouse import Warehouse
from market_pipeline.warehouse.decision_claims import (
    claim_open,
    mirror_claims,
    open_ticks,
    release_claims,
    tick_rows,
    write_outcomes,
)
from market_pipeline.warehouse.decisions import DecisionAction, DecisionKind, DecisionOutcome

# Only these outcomes make a batch run fail (an infeasible action is an outcome like any other).
FAILING_STATUSES = frozenset({DecisionOutcome.FAILED, DecisionOutcome.ERROR, DecisionOutcome.RUNNING})
# How often a batch writes the outcomes gathered so far (one statement each time: a write
# per action would cost more than the action on a big warehouse).
FLUSH_SECONDS = 5.0


@dataclass(frozen=True)
class ActionBatch:
    """Approved, live decisions of one kind sharing one tick (their `decided_at`)."""

    kind: DecisionKind
    tick: datetime
    decision_ids: tuple[str, ...]

    @property
    def batch_id(self) -> str:
        return batch_id_for(self.kind, self.tick)


@dataclass(frozen=True)
class ActionResult:
    decision_id: str
    action: DecisionAction
    target: str
    status: DecisionOutcome
    detail: str

    @property
    def outcome(self) -> str:
        """As written to decisions.outcome."""
        return f"{self.status}: {self.detail}"


def batch_id_for(kind: DecisionKind, tick: datetime) -> str:
    return f"{kind.value}@{_utc(tick).isoformat()}"


def parse_tick(text: str) -> datetime:
    """The ISO tick of a batch's run config; a bad one is one clear line."""
    try:
        tick = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"batch tick {text!r} is not an ISO timestamp") from None
    return _utc(tick)


def _texts(actions: Sequence[DecisionAction] | None) -> list[str] | None:
    """The action filter as the stored text (the driver takes plain str), if any."""
    return None if actions is None else [a.value for a in actions]


def pending_batches(
    store: Warehouse, kind: DecisionKind, actions: Sequence[DecisionAction] | None = None
) -> list[ActionBatch]:
    """Batches holding an approved, live decision without an outcome yet, oldest first.

    A decision claimed by a run that has not recorded its outcome stays pending, so that a
    resume run can settle it. Read-only.
    """
    if not store.exists():
        return []
    return [
        ActionBatch(kind, _utc(decided_at), tuple(ids))
        for decided_at, ids in open_ticks(store, kind.value, _texts(actions))
    ]


def batch_rows(
    store: Warehouse, kind: DecisionKind, tick: datetime, actions: Sequence[DecisionAction] | None = None
) -> list[dict[str, Any]]:
    """Every approved, live decision of the batch, executed or not, in decision-id order.
    On the cluster profile the claim columns are the control PostgreSQL's (outcomes it holds
    that the warehouse lost to a crash between the two writes are mirrored again here)."""
    rows = tick_rows(store, kind.value, tick, _texts(actions))
    if store.control is None or not rows:
        return rows
    claims = store.control.claims([r["decision_id"] for r in rows])
    unmirrored: dict[datetime, list[tuple[str, str]]] = {}
    for row in rows:
        held = claims.get(row["decision_id"])
        if held is None:  # never claimed under the control store (or decided before it)
            continue
        if held["executed_at"] is not None and row["executed_at"] is None:
            unmirrored.setdefault(held["executed_at"], []).append((row["decision_id"], held["outcome"]))
        row.update(held)
    for at, pairs in unmirrored.items():
        write_outcomes(store, pairs, at)
    return rows


def claim(
    store: Warehouse,
    decision_ids: Sequence[str],
    batch_id: str,
    run_id: str,
    now: datetime,
    take_over: Sequence[str] = (),
) -> set[str]:
    """Take the decisions for `run_id` in one statement; return those taken (not executed,
    and unclaimed, or held by this run or by a dead run named in `take_over`)."""
    if not decision_ids:
        return set()
    if store.control is not None:
        taken = store.control.claim(decision_ids, batch_id, run_id, now, [run_id, *take_over])
        if taken:  # mirrored for readers; the control PostgreSQL decides
            mirror_claims(store, sorted(taken), batch_id, run_id, now)
        return taken
    return claim_open(store, decision_ids, batch_id, run_id, now, [run_id, *take_over])


def record_outcomes(store: Warehouse, outcomes: Sequence[tuple[str, str]], now: datetime) -> None:
    """Write (decision id, outcome) pairs in one statement; a decision already executed keeps
    its first outcome (on the cluster profile, the first the control PostgreSQL took)."""
    if not outcomes:
        return
    if store.control is not None:
        outcomes = store.control.record_outcomes(outcomes, now)
    write_outcomes(store, outcomes, now)


def record_outcome(store: Warehouse, decision_id: str, now: datetime, outcome: str) -> None:
    record_outcomes(store, [(decision_id, outcome)], now)


def carry_out(
    store: Warehouse,
    rows: Sequence[dict[str, Any]],
    *,
    batch_id: str,
    run_id: str,
    now: datetime,
    run_is_live: Callable[[str], bool],
    resumable: bool,
    act: Callable[[dict[str, Any]], ActionResult],
    record: bool = True,
    checkpoint: Callable[[], None] = lambda: None,
) -> list[ActionResult]:
    """Claim the batch's open decisions, carry each claimed one out once; return what
    happened to every decision of the batch.

    All are claimed in one statement before the first action. With `record`, outcomes are
    written in bulk (every FLUSH_SECONDS and at the end, also when `act` raises); without it
    `act` records its own. An exception from `act` ends the batch: the claims not acted on
    are released, and the one that raised (no outcome) is settled by the next run.
    `checkpoint` runs before each write of outcomes: an adapter that holds its changes
    (`SimulatedAdapter.batch`) commits them first, so no outcome is recorded for an action the
    fleet does not keep.
    """
    settled: dict[str, ActionResult] = {}
    open_rows, dead = [], set()
    for row in rows:
        holder = row["claimed_by"]
        if row["executed_at"] is not None:
            settled[row["decision_id"]] = result_for(
                row, DecisionOutcome.SKIPPED, f"executed before: {row['outcome']}"
            )
        elif holder is not None and holder != run_id and run_is_live(holder):
            settled[row["decision_id"]] = result_for(
                row, DecisionOutcome.SKIPPED, f"in flight in run {holder}"
            )
        elif holder is not None and not resumable:
            settled[row["decision_id"]] = result_for(
                row,
                DecisionOutcome.ABANDONED,
                f"run {holder} stopped before recording an outcome; the next plan re-decides from the fleet",
            )
        else:
            open_rows.append(row)
            dead.update([holder] if holder is not None else [])
    abandoned = [(d, r.outcome) for d, r in settled.items() if r.status is DecisionOutcome.ABANDONED]
    record_outcomes(store, abandoned, now)
    taken = claim(store, [r["decision_id"] for r in open_rows], batch_id, run_id, now, sorted(dead))
    pending: list[ActionResult] = []
    flushed = time.monotonic()
    untouched = set(taken)
    try:
        for row in open_rows:
            if row["decision_id"] not in taken:
                settled[row["decision_id"]] = result_for(
                    row, DecisionOutcome.SKIPPED, "claimed by another run meanwhile"
                )
                continue
            untouched.discard(row["decision_id"])
            result = act(row)
            settled[row["decision_id"]] = result
            pending.append(result)
            if record and time.monotonic() - flushed > FLUSH_SECONDS:
                checkpoint()
                record_outcomes(store, [(r.decision_id, r.outcome) for r in pending], now)
                pending, flushed = [], time.monotonic()
    finally:
        if record:
            checkpoint()
            record_outcomes(store, [(r.decision_id, r.outcome) for r in pending], now)
        # Claims this run never acted on (it stopped early) go back, for the next run.
        release(store, sorted(untouched), run_id)
    return [settled[row["decision_id"]] for row in rows]


def release(store: Warehouse, decision_ids: Sequence[str], run_id: str) -> None:
    if decision_ids and store.control is not None:
        store.control.release(decision_ids, run_id)
    if decision_ids:
        release_claims(store, decision_ids, run_id)


def counts_by_status(results: Sequence[ActionResult]) -> dict[str, int]:
    """Outcome text -> how many (plain text: Dagster's metadata refuses enums)."""
    return dict(sorted(Counter(r.status.value for r in results).items()))


def failing(results: Sequence[ActionResult]) -> list[ActionResult]:
    return [r for r in results if r.status in FAILING_STATUSES]


def result_for(row: dict[str, Any], status: DecisionOutcome, detail: str) -> ActionResult:
    """What happened to one decision row of a batch (its stored action text read back)."""
    return ActionResult(
        row["decision_id"], DecisionAction(row["action"]), row["target"] or "", status, detail
    )


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
