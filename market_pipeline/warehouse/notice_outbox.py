"""The drain-warning notice file: a small SQLite outbox beside the warehouse file, outside
DuckDB's single-writer lock, and a bell that wakes the webhook delivery worker at once.

DuckDB lets one process hold its file at a time, and a drain holds it for as long as its
connection is open (`market-pipeline drain` keeps one for the whole drain): a notice read
from the warehouse's `drain_warning_outbox` waits for the drain that wrote it to let go of
the file. So, once the warning's begin row has committed (with its `drain_warning_outbox`
row, the durable record), the drain path also puts the warning here:

- `<warehouse stem>.notices.sqlite` next to the warehouse file, in WAL mode: a put is one
  short insert (readers never wait for it, nor it for them), keyed by drain id (a drain warns
  once; a second put of it is ignored);
- then it rings the bell: one datagram to an abstract Unix socket named after the file, on
  which the delivery worker waits. Nobody listening, or a full socket, costs nothing.

A put that fails (the file unwritable) is logged, not raised: the drain goes on, and the
worker's slower read of `drain_warning_outbox` delivers the notice. Each file carries a random
id, so a worker's cursor never skips the rows of a newer file at the same path. A DuckLake
warehouse has no file (and its readers do not wait for the writer): there, no notice file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from market_pipeline.warehouse.drain_outbox import DrainWarning

log = logging.getLogger(__name__)
SUFFIX = ".notices.sqlite"
BUSY_TIMEOUT_MS = 2000  # a put waits at most this long for another put; then it is left to the warehouse

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS drain_warnings (
        outbox_id INTEGER PRIMARY KEY AUTOINCREMENT, drain_id TEXT NOT NULL UNIQUE,
        warning TEXT NOT NULL, written_at REAL NOT NULL)""",
)


def notices_path(warehouse_path: Path) -> Path:
    """The notice file of the warehouse file at `warehouse_path`."""
    return warehouse_path.with_name(warehouse_path.stem + SUFFIX)


def bell_address(path: Path) -> str:
    """The abstract Unix socket of the notice file (Linux; no file on disk, gone with its process)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return f"\0market-pipeline-notices-{digest}"


def _encode(warning: DrainWarning) -> str:
    data = {
        "drain_id": warning.drain_id,
        "decision_id": warning.decision_id,
        "tenant_id": warning.tenant_id,
        "task_id": warning.task_id,
        "node_id": warning.node_id,
        "pool_id": warning.pool_id,
        "warned_at": warning.warned_at.isoformat(),
        "notice_seconds": warning.notice_seconds,
        "expected_drain_at": warning.expected_drain_at.isoformat(),
        "reasons": list(warning.reasons),
        "longer_notice": warning.longer_notice,
    }
    return json.dumps(data, sort_keys=True)


def _decode(outbox_id: int, text: str) -> DrainWarning:
    data = json.loads(text)
    return DrainWarning(
        drain_id=data["drain_id"],
        decision_id=data["decision_id"],
        tenant_id=data["tenant_id"],
        task_id=data["task_id"],
        node_id=data["node_id"],
        pool_id=data["pool_id"],
        warned_at=dt.datetime.fromisoformat(data["warned_at"]),
        notice_seconds=float(data["notice_seconds"]),
        expected_drain_at=dt.datetime.fromisoformat(data["expected_drain_at"]),
        reasons=tuple(data["reasons"]),
        longer_notice=data["longer_notice"],
        outbox_id=outbox_id,
    )


class NoticeOutbox:
    """The notice file at `path`; each call opens its own short connection (any thread, any process)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._ready = False

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            con.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            con.execute("PRAGMA synchronous=NORMAL")  # WAL: durable across a process crash
            if not self._ready:
                self._setup(con)
            yield con
        finally:
            con.close()

    def _setup(self, con: sqlite3.Connection) -> None:
        """WAL mode (persistent), the tables and the file's id; writes only what is missing."""
        if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            con.execute("PRAGMA journal_mode=WAL")
        for statement in _SCHEMA:
            con.execute(statement)
        if con.execute("SELECT 1 FROM meta WHERE key = 'file_id'").fetchone() is None:
            con.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('file_id', ?)", (uuid.uuid4().hex,))
        self._ready = True

    def file_id(self) -> str:
        """The file's random id (made with the file): a cursor is kept per file id."""
        with self._connect() as con:
            return str(con.execute("SELECT value FROM meta WHERE key = 'file_id'").fetchone()[0])

    def put(self, warning: DrainWarning) -> bool:
        """Add the warning (once per drain) and ring the bell; False (logged) when the file
        could not be written: the warehouse's outbox still holds the warning."""
        try:
            with self._connect() as con:
                con.execute(
                    "INSERT OR IGNORE INTO drain_warnings (drain_id, warning, written_at) VALUES (?, ?, ?)",
                    (warning.drain_id, _encode(warning), time.time()),
                )
        except (sqlite3.Error, OSError) as exc:
            log.warning(
                "drain %s: notice file %s not written (%s); the warehouse outbox has it",
                warning.drain_id,
                self.path,
                exc,
            )
            return False
        ring(self.path)
        return True

    def after(self, outbox_id: int, limit: int = 500) -> list[DrainWarning]:
        """Warnings past `outbox_id` in this file, oldest first, at most `limit`."""
        with self._connect() as con:
            rows = con.execute(
                "SELECT outbox_id, warning FROM drain_warnings WHERE outbox_id > ? ORDER BY outbox_id LIMIT ?",
                (outbox_id, limit),
            ).fetchall()
        return [_decode(int(i), text) for i, text in rows]

    def prune(self, older_than_seconds: float) -> int:
        """Forget warnings written more than `older_than_seconds` ago (the warehouse keeps them)."""
        with self._connect() as con:
            cur = con.execute(
                "DELETE FROM drain_warnings WHERE written_at < ?", (time.time() - older_than_seconds,)
            )
            return cur.rowcount


def ring(path: Path) -> None:
    """Wake the worker waiting on the notice file's bell, if one is; never blocks, never raises."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(b"!", bell_address(path))
    except OSError:
        pass  # nobody listens (the worker polls too), or its queue is full (it is awake)


class Bell:
    """The worker's side: `wait(timeout)` returns True when rung, False after `timeout`.
    Only one process can listen on a file's bell; another (`listening` False) just sleeps
    its timeout (and reads the file each time, as a poll)."""

    def __init__(self, path: Path) -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.bind(bell_address(path))
        except OSError as exc:
            log.info("notice bell of %s not bound (%s): reading the file on a timer", path, exc)
            self._sock.close()
            self._sock = None

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def wait(self, timeout: float) -> bool:
        if self._sock is None:
            time.sleep(timeout)
            return False
        self._sock.settimeout(timeout)
        try:
            self._sock.recv(64)
        except TimeoutError:
            return False
        self._sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:  # the rings that came meanwhile: one read of the file answers them all
                self._sock.recv(64)
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
