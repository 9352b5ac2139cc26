"""The service's keys and webhooks over its own store (`warehouse.service_store`, SQLite).

API keys are `mpk_<key id>_<secret>`; only the SHA-256 of the whole key is stored (a key is
32 random bytes, so a fast hash is enough: there is nothing to brute-force), and a lookup
hashes the presented key and compares hashes. The plain key is shown once, at creation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass

from market_pipeline.warehouse.service_store import ServiceStore

UTC = dt.timezone.utc
KEY_PREFIX = "mpk"
ROLE_TENANT = "tenant"
ROLE_OPERATOR = "operator"


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


class KeyStore(ServiceStore):
    """API keys (made and checked here; only their hashes stored) and tenants' webhooks."""

    # -- API keys -------------------------------------------------------------------------
    def create_key(self, role: str, tenant_id: str | None, label: str = "") -> tuple[str, str]:
        """A new key: (key_id, the plain key, shown once)."""
        if role not in (ROLE_TENANT, ROLE_OPERATOR):
            raise KeyStoreError(f"role must be {ROLE_TENANT!r} or {ROLE_OPERATOR!r}, got {role!r}")
        if role == ROLE_TENANT and not tenant_id:
            raise KeyStoreError("a tenant key needs --tenant")
        key_id = secrets.token_hex(6)
        key = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
        self.insert_key(
            key_id, role, tenant_id if role == ROLE_TENANT else None, hash_key(key), label, _now()
        )
        return key_id, key

    def revoke(self, key_id: str | None = None, tenant_id: str | None = None) -> int:
        """Revoke one key (by id) or every key of a tenant; returns how many were live."""
        if not key_id and not tenant_id:
            raise KeyStoreError("name a key id (--key-id) or a tenant (--tenant) to revoke")
        return self.revoke_keys(_now(), key_id, tenant_id)

    def keys(self) -> list[dict[str, object]]:
        return self.key_rows()

    def authenticate(self, key: str) -> Principal | None:
        """The live key's principal, or None (unknown, malformed or revoked)."""
        if not key.startswith(KEY_PREFIX + "_") or len(key) > 200:
            return None
        row = self.live_key(hash_key(key))
        if row is None or not secrets.compare_digest(row[3], hash_key(key)):
            return None
        return Principal(row[0], row[1], row[2])

    # -- webhooks -------------------------------------------------------------------------
    def register_webhook(self, tenant_id: str, url: str) -> Webhook:
        """Register `url` for the tenant (idempotent per url: the same id and secret again)."""
        existing = [w for w in self.webhooks(tenant_id) if w.url == url]
        if existing:
            return existing[0]
        hook = Webhook(f"wh_{secrets.token_hex(8)}", tenant_id, url, secrets.token_urlsafe(32), _now())
        self.insert_webhook(hook.webhook_id, hook.tenant_id, hook.url, hook.secret, hook.created_at)
        return hook

    def remove_webhook(self, tenant_id: str, webhook_id: str) -> bool:
        return self.mark_webhook_removed(tenant_id, webhook_id, _now())

    def webhooks(self, tenant_id: str | None) -> list[Webhook]:
        return [Webhook(*r) for r in self.webhook_rows(tenant_id=tenant_id)]

    def webhook(self, webhook_id: str) -> Webhook | None:
        rows = self.webhook_rows(webhook_id=webhook_id)
        return Webhook(*rows[0]) if rows else None

    def deliveries(self, tenant_id: str | None, limit: int = 500) -> list[dict[str, object]]:
        return self.delivery_rows(tenant_id, max(1, min(limit, 5000)))
