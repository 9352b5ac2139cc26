"""The service's own store (SQLite): API keys (hashes only), registered webhooks, the
webhook outbox cursor, and each delivery attempt.

Kept out of the warehouse on purpose: the warehouse has one writing process (the loop), and
the service must never contend with it for its own bookkeeping.

API keys are `mpk_<key id>_<secret>`; only the SHA-256 of the whole key is stored (a key is
32 random bytes, so a fast hash is enough: there is nothing to brute-force), and a lookup
hashes the presented key and compares hashes. The plain key is shown once, at creation.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

UTC = dt.timezone.utc
KEY_PREFIX = "mpk"
ROLE_TENANT = "tenant"
ROLE_OPERATOR = "operator"

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


class KeyStoreError(ValueError):
    """A key or webhook operation was refused; the message says why."""


@dataclass(frozen=True)
class Principal:
    key_id: str
    role: str
    tenant_id: str | None


@dataclass(frozen=True)
class Webhook:
    webhook_id: str
    tenant_id: str
    url: str
    secret: str
    created_at: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _now() -> str:
    return dt.datetime.now(UTC).isoformat()


class KeyStore:
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
        return self._con().execute(sql, params).fetchall()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._tx() as con:
            yield con

    # -- API keys -------------------------------------------------------------------------
    def create_key(self, role: str, tenant_id: str | None, label: str = "") -> tuple[str, str]:
        """A new key: (key_id, the plain key, shown once)."""
        if role not in (ROLE_TENANT, ROLE_OPERATOR):
            raise KeyStoreError(f"role must be {ROLE_TENANT!r} or {ROLE_OPERATOR!r}, got {role!r}")
        if role == ROLE_TENANT and not tenant_id:
            raise KeyStoreError("a tenant key needs --tenant")
        key_id = secrets.token_hex(6)
        key = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
        with self._tx() as con:
            con.execute(
                "INSERT INTO api_keys (key_id, role, tenant_id, key_hash, label, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (key_id, role, tenant_id if role == ROLE_TENANT else None, hash_key(key), label, _now()),
            )
        return key_id, key

    def revoke(self, key_id: str | None = None, tenant_id: str | None = None) -> int:
        """Revoke one key (by id) or every key of a tenant; returns how many were live."""
        if not key_id and not tenant_id:
            raise KeyStoreError("name a key id (--key-id) or a tenant (--tenant) to revoke")
        with self._tx() as con:
            cur = con.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE revoked_at IS NULL"
                " AND (? IS NULL OR key_id = ?) AND (? IS NULL OR tenant_id = ?)",
                (_now(), key_id, key_id, tenant_id, tenant_id),
            )
            return cur.rowcount

    def keys(self) -> list[dict[str, object]]:
        rows = self.read(
            "SELECT key_id, role, tenant_id, label, created_at, revoked_at FROM api_keys ORDER BY created_at"
        )
        names = ("key_id", "role", "tenant_id", "label", "created_at", "revoked_at")
        return [dict(zip(names, r)) for r in rows]

    def authenticate(self, key: str) -> Principal | None:
        """The live key's principal, or None (unknown, malformed or revoked)."""
        if not key.startswith(KEY_PREFIX + "_") or len(key) > 200:
            return None
        rows = self.read(
            "SELECT key_id, role, tenant_id, key_hash FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL",
            (hash_key(key),),
        )
        if not rows or not secrets.compare_digest(rows[0][3], hash_key(key)):
            return None
        return Principal(rows[0][0], rows[0][1], rows[0][2])

    # -- webhooks -------------------------------------------------------------------------
    def register_webhook(self, tenant_id: str, url: str) -> Webhook:
        """Register `url` for the tenant (idempotent per url: the same id and secret again)."""
        existing = [w for w in self.webhooks(tenant_id) if w.url == url]
        if existing:
            return existing[0]
        hook = Webhook(f"wh_{secrets.token_hex(8)}", tenant_id, url, secrets.token_urlsafe(32), _now())
        with self._tx() as con:
            con.execute(
                "INSERT INTO webhooks (webhook_id, tenant_id, url, secret, created_at) VALUES (?, ?, ?, ?, ?)",
                (hook.webhook_id, hook.tenant_id, hook.url, hook.secret, hook.created_at),
            )
        return hook

    def remove_webhook(self, tenant_id: str, webhook_id: str) -> bool:
        with self._tx() as con:
            cur = con.execute(
                "UPDATE webhooks SET removed_at = ? WHERE webhook_id = ? AND tenant_id = ? AND removed_at IS NULL",
                (_now(), webhook_id, tenant_id),
            )
            return cur.rowcount > 0

    def webhooks(self, tenant_id: str | None) -> list[Webhook]:
        rows = self.read(
            "SELECT webhook_id, tenant_id, url, secret, created_at FROM webhooks"
            " WHERE removed_at IS NULL AND (? IS NULL OR tenant_id = ?) ORDER BY created_at",
            (tenant_id, tenant_id),
        )
        return [Webhook(*r) for r in rows]

    def webhook(self, webhook_id: str) -> Webhook | None:
        rows = self.read(
            "SELECT webhook_id, tenant_id, url, secret, created_at FROM webhooks"
            " WHERE webhook_id = ? AND removed_at IS NULL",
            (webhook_id,),
        )
        return Webhook(*rows[0]) if rows else None

    def deliveries(self, tenant_id: str | None, limit: int = 500) -> list[dict[str, object]]:
        rows = self.read(
            "SELECT delivery_id, notice_id, webhook_id, tenant_id, attempt, state, http_status, error,"
            " claimed_at, finished_at FROM webhook_deliveries WHERE (? IS NULL OR tenant_id = ?)"
            " ORDER BY claimed_at DESC LIMIT ?",
            (tenant_id, tenant_id, max(1, min(limit, 5000))),
        )
        names = (
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
        return [dict(zip(names, r)) for r in rows]
