"""The service's own store (SQLite): API keys (hashes only), registered webhooks, the outbox
cursors, the webhook jobs and each delivery attempt; its schema and every statement on it.

Kept out of the warehouse's database on purpose: the warehouse has one writing process (the
loop), and the service must never contend with it for its own bookkeeping. What a key is, how
it is made and checked, and when a delivery is retried are the service's (`service.keystore`,
`service.webhooks`); this module only reads and writes rows.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS api_keys (
        key_id TEXT PRIMARY KEY, role TEXT NOT NULL, tenant_id TEXT, key_hash TEXT NOT NULL UNIQUE,
        label TEXT, created_at TEXT NOT NULL, revoked_at TEXT)""",
    """CREATE TABLE IF NOT EXISTS webhooks (
        webhook_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, url TEXT NOT NULL, secret TEXT NOT NULL,
        created_at TEXT NOT NULL, removed_at TEXT, UNIQUE (tenant_id, url))""",
    "CREATE TABLE IF NOT EXISTS outbox_cursor (name TEXT PRIMARY KEY, outbox_id INTEGER NOT NULL)",
    # One job per (notice, webhook): its state and the next attempt's time.
    """CREATE TABLE IF NOT EXISTS webhook_jobs (
        notice_id TEXT NOT NULL, webhook_id TEXT NOT NULL, tenant_id TEXT NOT NULL, body TEXT NOT NULL,
        state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
        created_at REAL NOT NULL, delivered_at REAL, PRIMARY KEY (notice_id, webhook_id))""",
    # One row per attempt, claimed before the request goes out: a delivery id is sent at most once.
    """CREATE TABLE IF NOT EXISTS webhook_deliveries (
        delivery_id TEXT PRIMARY KEY, notice_id TEXT NOT NULL, webhook_id TEXT NOT NULL,
        tenant_id TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL, http_status INTEGER,
        error TEXT, claimed_at REAL NOT NULL, finished_at REAL)""",
    "CREATE INDEX IF NOT EXISTS webhook_jobs_due ON webhook_jobs (state, next_at)",
)
KEY_COLUMNS = ("key_id", "role", "tenant_id", "label", "created_at", "revoked_at")
WEBHOOK_COLUMNS = ("webhook_id", "tenant_id", "url", "secret", "created_at")
DELIVERY_COLUMNS = (
    "delivery_id",
    "notice_id",
    "webhook_id",
    "tenant_id",
    "attempt",
    "state",
    "http_status",
    "error",
    "claimed_at",
    "finished_at",
)
# What a finished attempt does to its job: delivered, given up, or due again at a later time.
JobNext = Literal["delivered", "gave_up", "retry"]


class ServiceStore:
    """SQLite in WAL mode, one connection per thread (sqlite3 objects are per-thread)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._con().execute("PRAGMA journal_mode=WAL")  # persistent: readers never wait on a writer
        with self._tx() as con:
            for statement in _SCHEMA:
                con.execute(statement)

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=True)
            con.execute("PRAGMA busy_timeout=10000")  # WAL is the file's own mode (set once, below)
            self._local.con = con
        return con

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        con = self._con()
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Any read (operators' and tests' own questions of the store)."""
        return self._con().execute(sql, params).fetchall()

    # -- API keys -------------------------------------------------------------------------
    def insert_key(
        self, key_id: str, role: str, tenant_id: str | None, key_hash: str, label: str, created_at: str
    ) -> None:
        with self._tx() as con:
            con.execute(
                "INSERT INTO api_keys (key_id, role, tenant_id, key_hash, label, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (key_id, role, tenant_id, key_hash, label, created_at),
            )

    def revoke_keys(self, at: str, key_id: str | None, tenant_id: str | None) -> int:
        """Revoke the live keys matching the key id and/or tenant given; returns how many."""
        with self._tx() as con:
            cur = con.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE revoked_at IS NULL"
                " AND (? IS NULL OR key_id = ?) AND (? IS NULL OR tenant_id = ?)",
                (at, key_id, key_id, tenant_id, tenant_id),
            )
            return cur.rowcount

    def key_rows(self) -> list[dict[str, object]]:
        rows = self.read(f"SELECT {', '.join(KEY_COLUMNS)} FROM api_keys ORDER BY created_at")
        return [dict(zip(KEY_COLUMNS, r)) for r in rows]

    def live_key(self, key_hash: str) -> tuple[str, str, str | None, str] | None:
        """(key id, role, tenant, hash) of the live key with this hash, if any."""
        rows = self.read(
            "SELECT key_id, role, tenant_id, key_hash FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL",
            (key_hash,),
        )
        return rows[0] if rows else None

    # -- webhooks -------------------------------------------------------------------------
    def insert_webhook(self, webhook_id: str, tenant_id: str, url: str, secret: str, created_at: str) -> None:
        with self._tx() as con:
            con.execute(
                "INSERT INTO webhooks (webhook_id, tenant_id, url, secret, created_at) VALUES (?, ?, ?, ?, ?)",
                (webhook_id, tenant_id, url, secret, created_at),
            )

    def mark_webhook_removed(self, tenant_id: str, webhook_id: str, at: str) -> bool:
        with self._tx() as con:
            cur = con.execute(
                "UPDATE webhooks SET removed_at = ? WHERE webhook_id = ? AND tenant_id = ? AND removed_at IS NULL",
                (at, webhook_id, tenant_id),
            )
            return cur.rowcount > 0

    def webhook_rows(self, tenant_id: str | None = None, webhook_id: str | None = None) -> list[tuple]:
        """Live webhooks (WEBHOOK_COLUMNS), of one tenant and/or one id when given, oldest first."""
        return self.read(
            f"SELECT {', '.join(WEBHOOK_COLUMNS)} FROM webhooks WHERE removed_at IS NULL"
            " AND (? IS NULL OR tenant_id = ?) AND (? IS NULL OR webhook_id = ?) ORDER BY created_at",
            (tenant_id, tenant_id, webhook_id, webhook_id),
        )

    def delivery_rows(self, tenant_id: str | None, limit: int) -> list[dict[str, object]]:
        rows = self.read(
            f"SELECT {', '.join(DELIVERY_COLUMNS)} FROM webhook_deliveries WHERE (? IS NULL OR tenant_id = ?)"
            " ORDER BY claimed_at DESC LIMIT ?",
            (tenant_id, tenant_id, limit),
        )
        return [dict(zip(DELIVERY_COLUMNS, r)) for r in rows]

    # -- outboxes -> jobs -----------------------------------------------------------------
    def cursor(self, name: str) -> int:
        """The last outbox row a source's jobs were made from (0: none yet)."""
        rows = self.read("SELECT outbox_id FROM outbox_cursor WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else 0

    def add_jobs(
        self, notices: Sequence[tuple[str, str, str]], cursor: str, outbox_id: int, now: float
    ) -> None:
        """One pending job per (notice, live webhook of its tenant) for each (notice id, tenant,
        body), and the source's cursor at `outbox_id`, in one transaction; a job already there
        stays as it is."""
        with self._tx() as con:
            for notice_id, tenant_id, body in notices:
                con.execute(
                    "INSERT OR IGNORE INTO webhook_jobs (notice_id, webhook_id, tenant_id, body, state,"
                    " next_at, created_at) SELECT ?, webhook_id, tenant_id, ?, 'pending', ?, ? FROM webhooks"
                    " WHERE tenant_id = ? AND removed_at IS NULL ORDER BY created_at",
                    (notice_id, body, now, now, tenant_id),
                )
            con.execute(
                "INSERT INTO outbox_cursor (name, outbox_id) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET outbox_id = excluded.outbox_id",
                (cursor, outbox_id),
            )

    # -- jobs -> receivers ----------------------------------------------------------------
    def due_jobs(self, now: float, limit: int) -> list[tuple[str, str, int]]:
        """(notice id, webhook id, attempts so far) of the pending jobs due by `now`, soonest first."""
        return self.read(
            "SELECT notice_id, webhook_id, attempts FROM webhook_jobs WHERE state = 'pending' AND next_at <= ?"
            " ORDER BY next_at LIMIT ?",
            (now, limit),
        )

    def next_due(self) -> float | None:
        """When the soonest pending job falls due (None: none pending)."""
        rows = self.read("SELECT min(next_at) FROM webhook_jobs WHERE state = 'pending'")
        return rows[0][0] if rows else None

    def job_counts(self) -> list[tuple[str, int]]:
        """(state, jobs) for every state a job is in."""
        return self.read("SELECT state, count(*) FROM webhook_jobs GROUP BY state")

    def drop_job(self, notice_id: str, webhook_id: str) -> None:
        """The job's webhook was removed: nothing goes out."""
        with self._tx() as con:
            con.execute(
                "UPDATE webhook_jobs SET state = 'removed' WHERE notice_id = ? AND webhook_id = ?",
                (notice_id, webhook_id),
            )

    def claim_job(
        self,
        notice_id: str,
        webhook_id: str,
        attempts: int,
        *,
        lease_until: float,
        delivery_id: str,
        tenant_id: str,
        now: float,
    ) -> str | None:
        """Take the job's next attempt (held until `lease_until`) and record the delivery as
        sending, in one transaction; returns the body to send, or None when another worker
        took this attempt first."""
        with self._tx() as con:
            cur = con.execute(
                "UPDATE webhook_jobs SET attempts = attempts + 1, next_at = ? WHERE notice_id = ?"
                " AND webhook_id = ? AND state = 'pending' AND attempts = ?",
                (lease_until, notice_id, webhook_id, attempts),
            )
            if cur.rowcount != 1:
                return None
            body = con.execute(
                "SELECT body FROM webhook_jobs WHERE notice_id = ? AND webhook_id = ?",
                (notice_id, webhook_id),
            ).fetchone()[0]
            con.execute(
                "INSERT INTO webhook_deliveries (delivery_id, notice_id, webhook_id, tenant_id, attempt, state,"
                " claimed_at) VALUES (?, ?, ?, ?, ?, 'sending', ?)",
                (delivery_id, notice_id, webhook_id, tenant_id, attempts + 1, now),
            )
        return body

    def finish_delivery(
        self,
        delivery_id: str,
        notice_id: str,
        webhook_id: str,
        *,
        http_status: int | None,
        error: str | None,
        job_next: JobNext,
        now: float,
        retry_at: float | None = None,
    ) -> None:
        """Record the attempt's result and what it does to its job, in one transaction."""
        delivered = job_next == "delivered"
        with self._tx() as con:
            con.execute(
                "UPDATE webhook_deliveries SET state = ?, http_status = ?, error = ?, finished_at = ?"
                " WHERE delivery_id = ?",
                ("delivered" if delivered else "failed", http_status, error, now, delivery_id),
            )
            if delivered:
                con.execute(
                    "UPDATE webhook_jobs SET state = 'delivered', delivered_at = ? WHERE notice_id = ?"
                    " AND webhook_id = ?",
                    (now, notice_id, webhook_id),
                )
            elif job_next == "gave_up":
                con.execute(
                    "UPDATE webhook_jobs SET state = 'gave_up' WHERE notice_id = ? AND webhook_id = ?",
                    (notice_id, webhook_id),
                )
            else:
                con.execute(
                    "UPDATE webhook_jobs SET next_at = ? WHERE notice_id = ? AND webhook_id = ?",
                    (retry_at, notice_id, webhook_id),
                )
