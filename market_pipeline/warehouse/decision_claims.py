"""Claims and outcomes on `decisions`: the statements behind the action batches (which
approved, live decisions are open, who holds one, what carrying it out came to).

A claim is one conditional UPDATE, so two runs of the same batch cannot both take a decision;
an outcome is written once (a decision already executed keeps its first). Which decisions to
claim, and when, is the batches' (`action_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa

from market_pipeline.warehouse.errors import WarehouseError
from market_pipeline.warehouse.store import Warehouse, raise_unless_conflict, rollback

BATCH_COLUMNS = (
    "decision_id",
    "action",
    "pool_id",
    "target",
    "inputs",
    "executed_at",
    "outcome",
    "claimed_by",
)
_ACTION_FILTER = "AND list_contains(?, action)"
_CLAIM_SQL = (
    "UPDATE decisions SET claimed_by = ?, claimed_at = ?, batch_id = ? "
    "WHERE list_contains(?, decision_id) AND executed_at IS NULL "
    "AND (claimed_by IS NULL OR list_contains(?, claimed_by))"
)


def _filter(actions: Sequence[str] | None) -> tuple[str, list[Any]]:
    return ("", []) if actions is None else (_ACTION_FILTER, [list(actions)])


def open_ticks(
    store: Warehouse, kind: str, actions: Sequence[str] | None
) -> list[tuple[datetime, list[str]]]:
    """(decided at, decision ids) of each tick holding an approved, live decision of `kind`
    (and of one of `actions`, when given) without an outcome yet, oldest first."""
    where, params = _filter(actions)
    frame = store.query(
        "SELECT decided_at, list(decision_id ORDER BY decision_id) AS ids FROM decisions "
        f"WHERE kind = ? AND allowed AND NOT shadow AND executed_at IS NULL {where} "
        "GROUP BY decided_at ORDER BY decided_at",
        [kind, *params],
    )
    return [(row["decided_at"], list(row["ids"])) for row in frame.iter_rows(named=True)]


def tick_rows(
    store: Warehouse, kind: str, tick: datetime, actions: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Every approved, live decision of `kind` decided at `tick` (BATCH_COLUMNS), executed or
    not, in decision-id order."""
    where, params = _filter(actions)
    frame = store.query(
        f"SELECT {', '.join(BATCH_COLUMNS)} FROM decisions WHERE kind = ? AND allowed AND NOT shadow "
        f"AND decided_at = ? {where} ORDER BY decision_id",
        [kind, tick, *params],
    )
    return frame.to_dicts()


def mirror_claims(
    store: Warehouse, decision_ids: Sequence[str], batch_id: str, run_id: str, now: datetime
) -> None:
    """Write claims another store decided (the control PostgreSQL), for readers."""
    store.execute(
        "UPDATE decisions SET claimed_by = ?, claimed_at = ?, batch_id = ? "
        "WHERE list_contains(?, decision_id) AND executed_at IS NULL",
        [run_id, now, batch_id, sorted(decision_ids)],
    )


def claim_open(
    store: Warehouse,
    decision_ids: Sequence[str],
    batch_id: str,
    run_id: str,
    now: datetime,
    holders: Sequence[str],
) -> set[str]:
    """Take the decisions for `run_id` in one statement; return those taken (not executed, and
    unclaimed or held by one of `holders`)."""
    params = [run_id, now, batch_id, list(decision_ids), list(holders)]
    if store.lake is not None:
        return store.retrying(lambda: _claim_in_lake(store, params, batch_id))
    with store.connect() as con:
        try:
            taken = con.execute(_CLAIM_SQL + " RETURNING decision_id", params).fetchall()
        except duckdb.Error as exc:
            raise WarehouseError(f"claiming the decisions of batch {batch_id} failed: {exc}") from exc
    return {row[0] for row in taken}


def _claim_in_lake(store: Warehouse, params: list[Any], batch_id: str) -> set[str]:
    """The claim on a DuckLake (no UPDATE ... RETURNING): update, then read back what this run
    holds, in one transaction; a concurrent claimer's commit makes this one conflict and retry."""
    run_id, now, _batch, ids, _holders = params
    with store.connect() as con:
        con.execute("BEGIN")
        try:
            con.execute(_CLAIM_SQL, params)
            taken = con.execute(
                "SELECT decision_id FROM decisions WHERE list_contains(?, decision_id) "
                "AND claimed_by = ? AND claimed_at = ? AND executed_at IS NULL",
                [ids, run_id, now],
            ).fetchall()
            con.execute("COMMIT")
        except duckdb.Error as exc:
            rollback(con)
            raise_unless_conflict(exc, f"claiming the decisions of batch {batch_id} failed")
    return {row[0] for row in taken}


def write_outcomes(store: Warehouse, outcomes: Sequence[tuple[str, str]], now: datetime) -> None:
    """(decision id, outcome) pairs in one statement; a decision already executed keeps its
    first outcome."""
    if not outcomes:
        return
    frame = pa.table({"decision_id": [d for d, _ in outcomes], "outcome": [o for _, o in outcomes]})

    def write() -> None:
        with store.connect() as con:
            con.register("_outcomes", frame)
            try:
                con.execute(
                    "UPDATE decisions SET executed_at = ?, outcome = o.outcome FROM _outcomes o "
                    "WHERE decisions.decision_id = o.decision_id AND decisions.executed_at IS NULL",
                    [now],
                )
            except duckdb.Error as exc:
                raise_unless_conflict(exc, f"recording {len(outcomes)} action outcomes failed")
            finally:
                con.unregister("_outcomes")

    store.retrying(write)


def release_claims(store: Warehouse, decision_ids: Sequence[str], run_id: str) -> None:
    """Give back the run's claims on decisions it never carried out."""
    store.execute(
        "UPDATE decisions SET claimed_by = NULL, claimed_at = NULL WHERE "
        "list_contains(?, decision_id) AND claimed_by = ? AND executed_at IS NULL",
        [list(decision_ids), run_id],
    )
