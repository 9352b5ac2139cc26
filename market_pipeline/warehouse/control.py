"""The cluster profile's control state: the loop's state that needs one writer at a time, in
PostgreSQL with real constraints (a DuckLake has no primary key, no unique index and does not
conflict two appends of one key).

What lives here (schema `[control] schema_name`, made by `ControlStore.migrate`):
- `decision_claims`: one row per decision a batch run claimed (primary key: the decision), the
  claim taken by one `INSERT ... ON CONFLICT ... WHERE ... RETURNING`, the first outcome kept;
- `drain_journal`: every drain step (primary key `(drain_id, seq)`), the authority a drain
  resumes from; the warehouse's `drain_audit` mirrors it for readers and dbt;
- `adapter_blobs`: the simulated adapter's twin (its JSON state and Parquet buffers), so any
  worker reads and writes one fleet (`fleet.store.TwinStore` over `BlobStore`);
- locks: PostgreSQL session advisory locks (the twin's writer, a task's drain). The server drops
  one when its holder's connection dies (a worker killed with SIGKILL included), like the
  embedded default's `flock`, so there is no expiry to tune.

Every operation is one transaction. A connection that breaks (PostgreSQL restarted) is opened
again and the transaction retried until `retry_seconds`; past that, one line names the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from market_pipeline.warehouse.errors import WarehouseError
from market_pipeline.warehouse.lake import redact

T = TypeVar("T")
CONNECT_TIMEOUT_S = 5
RETRY_SECONDS = 30.0


class ControlError(WarehouseError):
    """The control PostgreSQL could not be reached or refused an operation (one line)."""


class ControlUnreachable(ControlError):
    """No connection to the control PostgreSQL could be made (names it and why)."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"cannot reach the {where}: {detail}")
        self.detail = detail


class ControlConflict(ControlError):
    """A constraint refused a second writer (a drain step already written differently)."""


# Versioned DDL of the control schema; append only (like warehouse/schema.py's migrations).
CONTROL_MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        1,
        "decision claims, drain journal, adapter blobs",
        (
            """CREATE TABLE decision_claims (
            decision_id text PRIMARY KEY, batch_id text NOT NULL, claimed_by text,
            claimed_at timestamptz, executed_at timestamptz, outcome text,
            CHECK ((executed_at IS NULL) = (outcome IS NULL)),
            CHECK ((claimed_by IS NULL) = (claimed_at IS NULL)))""",
            """CREATE TABLE drain_journal (
            drain_id text NOT NULL, seq integer NOT NULL CHECK (seq >= 0), state text NOT NULL,
            task_id text, recorded_at timestamptz NOT NULL, row jsonb NOT NULL,
            PRIMARY KEY (drain_id, seq))""",
            "CREATE INDEX drain_journal_task ON drain_journal (task_id)",
            """CREATE TABLE adapter_blobs (
            store text NOT NULL, name text NOT NULL, body bytea NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (store, name))""",
        ),
    ),
)


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum() or name[0].isdigit():
        raise ControlError(f"control schema name {name!r} must be letters, digits and _")
    return name


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for a lock's name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


_LOCAL = threading.local()


@dataclass(frozen=True)
class ControlStore:
    """The control state in the PostgreSQL `url` (libpq string or postgresql:// URL), schema
    `schema`."""

    url: str
    schema: str = "market_control"
    retry_seconds: float = RETRY_SECONDS

    def describe(self) -> str:
        return f"control PostgreSQL {redact(self.url)}"

    # -- connections ------------------------------------------------------------------
    def _open(self) -> Any:
        import psycopg2

        try:
            con = psycopg2.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg2.Error as exc:
            raise ControlUnreachable(self.describe(), _first_line(exc)) from None
        con.autocommit = False
        with con.cursor() as cur:
            cur.execute(f"SET search_path TO {_ident(self.schema)}, public")
        con.commit()
        return con

    def _cached(self) -> Any:
        """This thread's connection (one per process and thread; made on first use)."""
        cache = getattr(_LOCAL, "connections", None)
        if cache is None or getattr(_LOCAL, "pid", None) != os.getpid():
            cache, _LOCAL.pid = {}, os.getpid()
            _LOCAL.connections = cache
        con = cache.get(self)
        if con is None or con.closed:
            con = cache[self] = self._open()
        return con

    def _drop(self) -> None:
        con = getattr(_LOCAL, "connections", {}).pop(self, None)
        if con is not None:
            with contextlib.suppress(Exception):
                con.close()

    def transaction(self, operation: Callable[[Any], T], what: str) -> T:
        """Run `operation(cursor)` as one transaction, again (on a new connection) while the
        server cannot be reached or a serialisation conflict aborts it, until retry_seconds."""
        import psycopg2
        from psycopg2 import errorcodes

        deadline = time.monotonic() + self.retry_seconds
        delay = 0.05
        while True:
            try:
                con = self._cached()
                try:
                    with con.cursor() as cur:
                        result = operation(cur)
                    con.commit()
                    return result
                except BaseException:
                    with contextlib.suppress(Exception):
                        con.rollback()
                    raise
            except (psycopg2.OperationalError, psycopg2.InterfaceError, ControlError) as exc:
                if isinstance(exc, ControlConflict):
                    raise
                self._drop()
                lost = exc
            except psycopg2.Error as exc:
                if exc.pgcode not in (errorcodes.SERIALIZATION_FAILURE, errorcodes.DEADLOCK_DETECTED):
                    raise ControlError(
                        f"{what} failed in the {self.describe()}: {_first_line(exc)}"
                    ) from None
                lost = exc
            if time.monotonic() > deadline:
                detail = lost.detail if isinstance(lost, ControlUnreachable) else _first_line(lost)
                raise ControlError(
                    f"{what}: cannot reach the {self.describe()} for {self.retry_seconds:g}s: {detail}"
                ) from None
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)

    # -- schema -----------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Create the schema and apply pending migrations (under an advisory lock, so that two
        workers starting together do not race); return the versions applied."""
        schema = _ident(self.schema)

        def run(cur: Any) -> list[int]:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key(f"{schema}:migrate")])
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {schema}.control_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur.execute(f"SELECT version FROM {schema}.control_migrations")
            done = {row[0] for row in cur.fetchall()}
            applied = []
            for version, name, statements in CONTROL_MIGRATIONS:
                if version in done:
                    continue
                for statement in statements:
                    cur.execute(statement)
                cur.execute(
                    f"INSERT INTO {schema}.control_migrations (version, name) VALUES (%s, %s)",
                    [version, name],
                )
                applied.append(version)
            return applied

        return self.transaction(run, "migrating the control schema")

    # -- decision claims --------------------------------------------------------------
    def claim(
        self, decision_ids: Sequence[str], batch_id: str, run_id: str, now: datetime, holders: Sequence[str]
    ) -> set[str]:
        """Take the decisions for `run_id` in one statement: those with no claim row, or not
        executed and unclaimed or held by one of `holders` (this run, dead runs taken over).
        The primary key makes a second claimer's insert meet the first's row."""
        if not decision_ids:
            return set()

        def run(cur: Any) -> set[str]:
            cur.execute(
                "INSERT INTO decision_claims AS c (decision_id, batch_id, claimed_by, claimed_at) "
                "SELECT d, %s, %s, %s FROM unnest(%s::text[]) AS d "
                "ON CONFLICT (decision_id) DO UPDATE SET claimed_by = EXCLUDED.claimed_by, "
                "claimed_at = EXCLUDED.claimed_at, batch_id = EXCLUDED.batch_id "
                "WHERE c.executed_at IS NULL AND (c.claimed_by IS NULL OR c.claimed_by = ANY(%s::text[])) "
                "RETURNING decision_id",
                [batch_id, run_id, now, list(decision_ids), list(holders)],
            )
            return {row[0] for row in cur.fetchall()}

        return self.transaction(run, f"claiming the decisions of batch {batch_id}")

    def record_outcomes(self, outcomes: Sequence[tuple[str, str]], now: datetime) -> list[tuple[str, str]]:
        """Write each (decision id, outcome) once: a decision already executed keeps its first
        outcome. Returns the pairs this call wrote (the ones to mirror into the warehouse)."""
        if not outcomes:
            return []

        def run(cur: Any) -> list[tuple[str, str]]:
            cur.execute(
                "INSERT INTO decision_claims AS c (decision_id, batch_id, executed_at, outcome) "
                "SELECT d, '', %s, o FROM unnest(%s::text[], %s::text[]) AS t(d, o) "
                "ON CONFLICT (decision_id) DO UPDATE SET executed_at = EXCLUDED.executed_at, "
                "outcome = EXCLUDED.outcome WHERE c.executed_at IS NULL RETURNING decision_id, outcome",
                [now, [d for d, _ in outcomes], [o for _, o in outcomes]],
            )
            return [(row[0], row[1]) for row in cur.fetchall()]

        return self.transaction(run, f"recording {len(outcomes)} action outcomes")

    def release(self, decision_ids: Sequence[str], run_id: str) -> None:
        if not decision_ids:
            return

        def run(cur: Any) -> None:
            cur.execute(
                "UPDATE decision_claims SET claimed_by = NULL, claimed_at = NULL WHERE "
                "decision_id = ANY(%s::text[]) AND claimed_by = %s AND executed_at IS NULL",
                [list(decision_ids), run_id],
            )

        self.transaction(run, "releasing claims")

    def claims(self, decision_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The claim rows of these decisions (claimed_by, claimed_at, executed_at, outcome)."""

        def run(cur: Any) -> dict[str, dict[str, Any]]:
            cur.execute(
                "SELECT decision_id, claimed_by, claimed_at, executed_at, outcome FROM decision_claims "
                "WHERE decision_id = ANY(%s::text[])",
                [list(decision_ids)],
            )
            return {
                r[0]: {"claimed_by": r[1], "claimed_at": r[2], "executed_at": r[3], "outcome": r[4]}
                for r in cur.fetchall()
            }

        return self.transaction(run, "reading claims") if decision_ids else {}

    # -- drain journal ----------------------------------------------------------------
    def append_step(self, row: dict[str, Any]) -> bool:
        """Write one drain step; True if written now, False if this very row was written
        before (a retry after a lost commit). A different row under the same (drain_id, seq)
        is a second writer: ControlConflict."""
        payload = json.dumps(row, sort_keys=True, default=str)

        def run(cur: Any) -> bool:
            cur.execute(
                "INSERT INTO drain_journal (drain_id, seq, state, task_id, recorded_at, row) "
                "VALUES (%s, %s, %s, %s, %s, %s::jsonb) ON CONFLICT (drain_id, seq) DO NOTHING "
                "RETURNING seq",
                [row["drain_id"], row["seq"], row["state"], row.get("task_id"), row["recorded_at"], payload],
            )
            if cur.fetchone() is not None:
                return True
            cur.execute(
                "SELECT row = %s::jsonb FROM drain_journal WHERE drain_id = %s AND seq = %s",
                [payload, row["drain_id"], row["seq"]],
            )
            same = cur.fetchone()
            if same is not None and same[0]:
                return False
            raise ControlConflict(f"drain {row['drain_id']}: seq {row['seq']} already written")

        return self.transaction(run, f"appending step {row['seq']} of drain {row['drain_id']}")

    def open_drain_ids(self, task_id: str, terminal: Sequence[str]) -> list[str]:
        """The task's drains with no terminal step in the journal."""

        def run(cur: Any) -> list[str]:
            cur.execute(
                "SELECT drain_id FROM drain_journal WHERE task_id = %s GROUP BY drain_id "
                "HAVING NOT bool_or(state = ANY(%s::text[])) ORDER BY drain_id",
                [task_id, list(terminal)],
            )
            return [r[0] for r in cur.fetchall()]

        return self.transaction(run, f"reading the open drains of task {task_id}")

    def drain_steps(self, drain_id: str) -> list[dict[str, Any]]:
        def run(cur: Any) -> list[dict[str, Any]]:
            cur.execute("SELECT row FROM drain_journal WHERE drain_id = %s ORDER BY seq", [drain_id])
            return [r[0] for r in cur.fetchall()]

        return self.transaction(run, f"reading drain {drain_id}")

    def seed(
        self, steps: Sequence[dict[str, Any]], outcomes: Sequence[tuple[str, datetime, str]]
    ) -> dict[str, int]:
        """Load drain steps and executed outcomes copied from an embedded warehouse (rows
        already there kept); return how many of the given keys each table holds afterwards."""

        def run(cur: Any) -> dict[str, int]:
            cur.execute(
                "INSERT INTO drain_journal (drain_id, seq, state, task_id, recorded_at, row) "
                "SELECT r->>'drain_id', (r->>'seq')::int, r->>'state', r->>'task_id', "
                "(r->>'recorded_at')::timestamptz, r FROM jsonb_array_elements(%s::jsonb) AS r "
                "ON CONFLICT (drain_id, seq) DO NOTHING",
                [json.dumps(list(steps), default=str)],
            )
            cur.execute(
                "INSERT INTO decision_claims (decision_id, batch_id, executed_at, outcome) "
                "SELECT d, '', a, o FROM unnest(%s::text[], %s::timestamptz[], %s::text[]) AS t(d, a, o) "
                "ON CONFLICT (decision_id) DO NOTHING",
                [[d for d, _, _ in outcomes], [a for _, a, _ in outcomes], [o for _, _, o in outcomes]],
            )
            cur.execute(
                "SELECT count(*) FROM drain_journal j JOIN jsonb_array_elements(%s::jsonb) AS r "
                "ON j.drain_id = r->>'drain_id' AND j.seq = (r->>'seq')::int",
                [json.dumps([{"drain_id": x["drain_id"], "seq": x["seq"]} for x in steps])],
            )
            journal = int(cur.fetchone()[0])
            cur.execute(
                "SELECT count(*) FROM decision_claims WHERE decision_id = ANY(%s::text[]) AND executed_at IS NOT NULL",
                [[d for d, _, _ in outcomes]],
            )
            return {"drain_journal": journal, "decision_claims": int(cur.fetchone()[0])}

        return self.transaction(run, "seeding the control state")

    # -- adapter blobs ----------------------------------------------------------------
    def blob(self, store: str, name: str, head: int | None = None) -> bytes | None:
        def run(cur: Any) -> bytes | None:
            column = "body" if head is None else f"substring(body from 1 for {int(head)})"
            cur.execute(f"SELECT {column} FROM adapter_blobs WHERE store = %s AND name = %s", [store, name])
            row = cur.fetchone()
            return None if row is None else bytes(row[0])

        return self.transaction(run, f"reading {name} of {store}")

    def put_blobs(self, store: str, blobs: Sequence[tuple[str, bytes | None]]) -> None:
        """Write (name, body) pairs in one transaction, in order; a None body deletes."""
        import psycopg2

        def run(cur: Any) -> None:
            for name, body in blobs:
                if body is None:
                    cur.execute("DELETE FROM adapter_blobs WHERE store = %s AND name = %s", [store, name])
                else:
                    cur.execute(
                        "INSERT INTO adapter_blobs (store, name, body) VALUES (%s, %s, %s) "
                        "ON CONFLICT (store, name) DO UPDATE SET body = EXCLUDED.body, updated_at = now()",
                        [store, name, psycopg2.Binary(body)],
                    )

        self.transaction(run, f"writing {len(blobs)} blobs of {store}")

    def blob_names(self, store: str, prefix: str) -> list[str]:
        def run(cur: Any) -> list[str]:
            cur.execute(
                "SELECT name FROM adapter_blobs WHERE store = %s AND starts_with(name, %s) ORDER BY name",
                [store, prefix],
            )
            return [r[0] for r in cur.fetchall()]

        return self.transaction(run, f"listing {prefix}* of {store}")

    # -- locks ------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str, wait_seconds: float) -> Iterator[None]:
        """Hold the advisory lock `name` on a connection of its own for the block; LockBusy
        after `wait_seconds`. The server drops it if this process dies."""
        con = self._open()
        key = lock_key(name)
        deadline = time.monotonic() + wait_seconds
        try:
            con.autocommit = True
            with con.cursor() as cur:
                while True:
                    cur.execute("SELECT pg_try_advisory_lock(%s)", [key])
                    if cur.fetchone()[0]:
                        break
                    if time.monotonic() > deadline:
                        raise LockBusy(f"{name} is held by {self._holder(cur, key)} ({self.describe()})")
                    time.sleep(0.02)
            try:
                yield
            finally:
                with contextlib.suppress(Exception), con.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [key])
        finally:
            con.close()

    @staticmethod
    def _holder(cur: Any, key: int) -> str:
        """Who holds an advisory lock, for the message: the holder's application and backend."""
        cur.execute(
            "SELECT a.pid, a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            "AND ((l.classid::bigint << 32) | l.objid::bigint) = %s::bigint "
            "LIMIT 1",
            [key],
        )
        row = cur.fetchone()
        if row is None:
            return "another session"
        return f"PostgreSQL backend {row[0]}" + (f" ({row[1]})" if row[1] else "")


@dataclass(frozen=True)
class ControlBlobs:
    """One named store of blobs in the control PostgreSQL (`fleet.store.Blobs`): the simulated
    adapter's twin, shared by every worker; writes land in one transaction."""

    control: ControlStore
    key: str

    def get(self, name: str, head: int | None = None) -> bytes | None:
        return self.control.blob(self.key, name, head)

    def put(self, blobs: Sequence[tuple[str, bytes | None]]) -> None:
        self.control.put_blobs(self.key, blobs)

    def names(self, prefix: str) -> list[str]:
        return self.control.blob_names(self.key, prefix)

    @contextlib.contextmanager
    def lock(self, wait_seconds: float) -> Iterator[None]:
        with self.control.lock(f"twin:{self.key}", wait_seconds):
            yield

    def describe(self) -> str:
        return f"twin {self.key!r} in the {self.control.describe()}"


class LockBusy(ControlError):
    """Another process holds the advisory lock (names the lock and its holder)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
