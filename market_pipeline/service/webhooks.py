"""Drain-warning webhooks: from the drain's outboxes to each registered receiver.

- The drain path writes `drain_warning_outbox` in the transaction of the warning's begin row
  (warehouse/drain_outbox.py), and once that commits, the notice file beside the warehouse
  file (warehouse/notice_outbox.py: SQLite, outside DuckDB's writer lock), whose bell wakes
  the worker. It never calls a receiver, so a slow or lost receiver cannot hold up a drain.
- `DeliveryWorker.take_notices` (woken by the bell) and `DeliveryWorker.poll_outbox` (the
  warehouse's outbox, read when the writer lets go of the file: what a notice file missed)
  copy new rows (past a cursor per source, kept in the key store) into one job per registered
  webhook of the drain's tenant, cursor and jobs in one SQLite transaction. A job is keyed by
  (notice, webhook), so the notice the two sources both hold makes one job.
- `DeliveryWorker.deliver_due` claims each due job with a compare-and-set on its attempt
  count and records the attempt under a fresh delivery id before the request goes out: a
  delivery id is sent at most once, by one worker, even with two workers running. A failed
  attempt (non-2xx, timeout, refused connection) is retried with exponential backoff (full
  jitter) under a new delivery id; the notice id stays the same, so a receiver can drop a
  notice it already has.
- Requests go only to the URL the tenant registered: the body never names a destination and
  redirects are not followed.
- Signature: `X-MP-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import random
import secrets
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from market_pipeline.config import ServiceConfig
from market_pipeline.service.gate import GatedWarehouse, WarehouseBusy, file_signature
from market_pipeline.service.keystore import KeyStore, Webhook
from market_pipeline.warehouse import WarehouseError
from market_pipeline.warehouse.drain_outbox import DrainWarning, drain_warnings_after
from market_pipeline.warehouse.notice_outbox import Bell, NoticeOutbox, notices_path, ring
from market_pipeline.warehouse.service_store import JobNext

log = logging.getLogger(__name__)
CURSOR = "drain_warning_outbox"
NOTICE_CURSOR = "notices:"  # + the notice file's id
NOTICE_RETENTION_SECONDS = 7 * 86400  # the warehouse's outbox keeps every warning
SIGNATURE_HEADER = "X-MP-Signature"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, now: float, tolerance_seconds: float = 300) -> bool:
    """A receiver's check: the signature matches and its timestamp is recent."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        timestamp = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs(now - timestamp) > tolerance_seconds:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), header)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003 - urllib's signature
        return None  # only the registered URL is ever called


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass(frozen=True)
class Attempt:
    delivery_id: str
    notice_id: str
    webhook: Webhook
    body: bytes
    attempt: int


def post(attempt: Attempt, timeout: float) -> tuple[int | None, str | None]:
    """(HTTP status, error text); status None when no answer came."""
    timestamp = int(time.time())
    request = urllib.request.Request(
        attempt.webhook.url,
        data=attempt.body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "market-pipeline-webhooks/1",
            "X-MP-Event": "drain.warning",
            "X-MP-Notice-Id": attempt.notice_id,
            "X-MP-Delivery-Id": attempt.delivery_id,
            SIGNATURE_HEADER: sign(attempt.webhook.secret, timestamp, attempt.body),
        },
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(1024)
            return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, type(exc).__name__ + ": " + str(getattr(exc, "reason", exc))[:200]


class DeliveryWorker:
    def __init__(
        self,
        warehouse: GatedWarehouse,
        store: KeyStore,
        settings: ServiceConfig,
        clock: Callable[[], float] = time.time,
        sender: Callable[[Attempt, float], tuple[int | None, str | None]] = post,
        threads: int = 8,
    ) -> None:
        self.warehouse = warehouse
        self.store = store
        self.settings = settings
        self.clock = clock
        self.sender = sender
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="webhook")
        self._seen: tuple[int, ...] | None = None
        self.notices = NoticeOutbox(notices_path(warehouse.path)) if warehouse.lake is None else None

    # -- outboxes -> jobs -----------------------------------------------------------------
    def _cursor(self, name: str) -> int:
        return self.store.cursor(name)

    def take_notices(self) -> int:
        """New rows of the notice file become jobs; returns the rows taken. Nothing to read
        before a drain has written the file (the worker never makes it)."""
        if self.notices is None or not self.notices.path.exists():
            return 0
        name = NOTICE_CURSOR + self.notices.file_id()
        warnings = self.notices.after(self._cursor(name))
        if warnings:
            self._add_jobs(warnings, name)
        return len(warnings)

    def poll_outbox(self) -> int:
        """New rows of the warehouse's outbox become jobs (none for a notice the notice file
        brought first); returns the rows taken."""
        signature = file_signature(self.warehouse.path)
        if signature == self._seen or not self.warehouse.path.exists():
            return 0  # nothing was written since the last look: no open, no lock taken
        cursor = self._cursor(CURSOR)
        try:
            with self.warehouse.connect(read_only=True) as con:
                warnings = drain_warnings_after(con, cursor)
        except WarehouseBusy:
            return 0  # the writer holds the file: the next poll tries again
        except WarehouseError as exc:
            log.warning("drain warning outbox not readable yet: %s", " ".join(str(exc).split())[:200])
            return 0
        if len(warnings) < 500:
            self._seen = signature
        if warnings:
            self._add_jobs(warnings, CURSOR)
        return len(warnings)

    def _add_jobs(self, warnings: list[DrainWarning], cursor: str) -> None:
        """One pending job per (warning, webhook of its tenant), and the source's cursor past
        the last warning, in one transaction; a job already there stays as it is."""
        notices = [
            (
                f"drain-warning:{warning.drain_id}",
                warning.tenant_id,
                json.dumps(warning.payload(), sort_keys=True, separators=(",", ":")),
            )
            for warning in warnings
        ]
        self.store.add_jobs(notices, cursor, warnings[-1].outbox_id, self.clock())

    # -- jobs -> receivers ----------------------------------------------------------------
    def _claim(self, notice_id: str, webhook_id: str, attempts: int) -> Attempt | None:
        hook = self.store.webhook(webhook_id)
        now = self.clock()
        lease = now + self.settings.webhook_timeout_seconds + 5.0  # no second worker meanwhile
        delivery_id = f"dlv_{secrets.token_hex(10)}"
        if hook is None:  # removed since: nothing goes out
            self.store.drop_job(notice_id, webhook_id)
            return None
        body = self.store.claim_job(
            notice_id,
            webhook_id,
            attempts,
            lease_until=lease,
            delivery_id=delivery_id,
            tenant_id=hook.tenant_id,
            now=now,
        )
        if body is None:
            return None  # another worker claimed it
        return Attempt(delivery_id, notice_id, hook, body.encode(), attempts + 1)

    def _finish(self, attempt: Attempt, status: int | None, error: str | None) -> bool:
        ok = status is not None and 200 <= status < 300
        now = self.clock()
        retry_at = None
        if ok:
            job_next: JobNext = "delivered"
        elif attempt.attempt >= self.settings.webhook_max_attempts:
            job_next = "gave_up"
        else:
            job_next = "retry"
            cap = min(
                self.settings.webhook_backoff_max_seconds,
                self.settings.webhook_backoff_seconds * 2 ** (attempt.attempt - 1),
            )
            retry_at = now + random.uniform(cap / 2, cap)
        self.store.finish_delivery(
            attempt.delivery_id,
            attempt.notice_id,
            attempt.webhook.webhook_id,
            http_status=status,
            error=None if ok else error,
            job_next=job_next,
            now=now,
            retry_at=retry_at,
        )
        return ok

    def _send(self, attempt: Attempt) -> bool:
        status, error = self.sender(attempt, self.settings.webhook_timeout_seconds)
        return self._finish(attempt, status, error)

    def deliver_due(self, limit: int = 256) -> int:
        """Send every due job once (concurrently); returns how many were delivered."""
        due = self.store.due_jobs(self.clock(), limit)
        attempts = [a for a in (self._claim(*row) for row in due) if a is not None]
        return sum(self.pool.map(self._send, attempts))

    def next_wait(self) -> float:
        """Seconds until the next step: the outbox poll's interval, or sooner when a retry
        falls due before it (a retry does not wait for the next poll)."""
        poll = self.settings.webhook_poll_seconds
        due = self.store.next_due()
        if due is None:
            return poll
        return min(poll, max(0.01, float(due) - self.clock()))

    def run(self, stop: threading.Event) -> None:
        """Three loops, so none waits behind another:
        - the notice file (its own thread): read at once when a drain rings the bell (and
          every `webhook_poll_seconds` besides);
        - the warehouse's outbox (its own thread, every `webhook_reconcile_seconds`, or every
          `webhook_poll_seconds` without a notice file): it may wait for the loop's writer to
          let go of the file;
        - the deliveries (here): due jobs as soon as they fall due, woken when either source
          adds some."""
        wake = threading.Event()
        threads = []

        def loop(name: str, step: Callable[[], int], pause: Callable[[float], object], every: float) -> None:
            while not stop.is_set():
                try:
                    if step():
                        wake.set()
                except Exception:  # a reader that dies silently would lose notices: log, go on
                    log.exception("webhook %s failed", name)
                pause(every)
            wake.set()  # stopping: the deliveries' wait ends now,
            if self.notices is not None:
                ring(self.notices.path)  # and so does the bell's (stop.wait ends the outbox read's)

        poll = self.settings.webhook_poll_seconds
        bell = None
        if self.notices is not None:
            with contextlib.suppress(OSError, sqlite3.Error):
                if self.notices.path.exists():
                    self.notices.prune(NOTICE_RETENTION_SECONDS)
            bell = Bell(self.notices.path)
            threads.append(("notice file", self.take_notices, bell.wait, poll))
            threads.append(
                ("outbox read", self.poll_outbox, stop.wait, self.settings.webhook_reconcile_seconds)
            )
        else:
            threads.append(("outbox read", self.poll_outbox, stop.wait, poll))
        started = [
            threading.Thread(target=loop, args=spec, name=f"webhook-{spec[0].replace(' ', '-')}", daemon=True)
            for spec in threads
        ]
        for thread in started:
            thread.start()
        while not stop.is_set():
            wake.clear()  # a source that adds jobs from here on cuts the wait below short
            wait = poll
            try:
                self.deliver_due()
                wait = self.next_wait()
            except Exception:  # as above: log and go on
                log.exception("webhook delivery step failed")
            wake.wait(wait)
        for thread in started:
            thread.join(timeout=self.settings.read_retry_seconds + 5)
        if bell is not None:
            bell.close()
        self.pool.shutdown(wait=True)
