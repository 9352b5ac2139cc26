"""Balances and budget guards.

The ledger holds money movements per tenant: top-ups and adjustments (finance), and one
entry per tenant, hour and charge category posted from the hourly invoice lines (usage
debits, SLA credits). Posting a window replaces that window's posted entries in one
transaction, so reposting is exactly-once.

Guards apply to tenants with a `billing_accounts` row: a prepaid account whose balance
(plus credit limit) cannot cover the next interval at the current burn rate, or a tenant
whose spend would pass a hard cap (daily or monthly), has new tasks refused and its
running tasks drained after the grace period (through the task-drain guardrail, which
reads the `budget_guard` decisions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import polars as pl

from market_pipeline.billing.errors import BillingError
from market_pipeline.warehouse import Warehouse

UTC = dt.timezone.utc
POSTED_KINDS = ("usage", "sla_credit")
MANUAL_KINDS = ("top_up", "adjustment")


@dataclass(frozen=True)
class Account:
    tenant_id: str
    prepaid: bool
    credit_limit: Decimal = Decimal(0)
    hard_cap_daily: Decimal | None = None
    hard_cap_monthly: Decimal | None = None


@dataclass(frozen=True)
class TenantSpend:
    balance: Decimal  # sum of the ledger
    spent_today: Decimal  # rated usage net of credits, this UTC day
    spent_month: Decimal  # rated usage net of credits, this UTC month


@dataclass(frozen=True)
class GuardVerdict:
    tenant_id: str
    admit_new_tasks: bool
    drain_running: bool
    drain_after: dt.datetime | None
    balance: Decimal
    available: Decimal | None  # prepaid: balance + credit limit
    next_interval_cost: Decimal
    reasons: tuple[str, ...] = field(default=())


def set_account(warehouse: Warehouse, account: Account, now: dt.datetime | None = None) -> None:
    if account.credit_limit < 0:
        raise BillingError(f"credit_limit must be >= 0, got {account.credit_limit}")
    for name in ("hard_cap_daily", "hard_cap_monthly"):
        cap = getattr(account, name)
        if cap is not None and cap < 0:
            raise BillingError(f"{name} must be >= 0, got {cap}")
    warehouse.upsert("billing_accounts", pl.DataFrame([{
        "tenant_id": account.tenant_id, "prepaid": account.prepaid,
        "credit_limit": account.credit_limit, "hard_cap_daily": account.hard_cap_daily,
        "hard_cap_monthly": account.hard_cap_monthly, "updated_at": now or dt.datetime.now(UTC),
    }], schema={"tenant_id": pl.Utf8, "prepaid": pl.Boolean, "credit_limit": pl.Decimal(20, 9),
                "hard_cap_daily": pl.Decimal(20, 9), "hard_cap_monthly": pl.Decimal(20, 9),
                "updated_at": pl.Datetime("us", "UTC")}))


def accounts(warehouse: Warehouse) -> list[Account]:
    frame = warehouse.query("SELECT tenant_id, prepaid, credit_limit, hard_cap_daily, hard_cap_monthly"
                            " FROM billing_accounts ORDER BY tenant_id")
    return [Account(*row) for row in frame.iter_rows()]


def record_payment(warehouse: Warehouse, tenant_id: str, amount: Decimal, reference: str,
                   kind: str = "top_up", now: dt.datetime | None = None) -> str:
    """A top-up (or signed adjustment); idempotent by `reference`. Returns the entry id."""
    if kind not in MANUAL_KINDS:
        raise BillingError(f"ledger kind must be one of {MANUAL_KINDS}, got {kind!r}")
    if kind == "top_up" and amount <= 0:
        raise BillingError(f"a top-up must be positive, got {amount}")
    if not reference:
        raise BillingError("a payment needs a reference (it makes the entry idempotent)")
    entry_id = f"{kind}:{tenant_id}:{reference}"
    warehouse.upsert("billing_ledger", pl.DataFrame([{
        "entry_id": entry_id, "tenant_id": tenant_id, "kind": kind, "amount": amount,
        "period_start": None, "recorded_at": now or dt.datetime.now(UTC), "reference": reference,
    }], schema={"entry_id": pl.Utf8, "tenant_id": pl.Utf8, "kind": pl.Utf8, "amount": pl.Decimal(20, 9),
                "period_start": pl.Datetime("us", "UTC"), "recorded_at": pl.Datetime("us", "UTC"),
                "reference": pl.Utf8}))
    return entry_id


def post_invoice_window(warehouse: Warehouse, start: dt.datetime, end: dt.datetime,
                        now: dt.datetime | None = None) -> int:
    """Replace the ledger's posted entries for hours in [start, end) from the invoice lines."""
    now = now or dt.datetime.now(UTC)
    with warehouse.connect() as con:
        con.execute("BEGIN")
        try:
            con.execute("DELETE FROM billing_ledger WHERE kind IN ('usage', 'sla_credit')"
                        " AND period_start >= ? AND period_start < ?", [start, end])
            con.execute("""
                INSERT INTO billing_ledger
                SELECT CASE charge_category WHEN 'Usage' THEN 'usage' ELSE 'sla_credit' END
                           || ':' || tenant_id || ':' || strftime(period_start_utc, '%Y-%m-%dT%H:%M:%S'),
                       tenant_id,
                       CASE charge_category WHEN 'Usage' THEN 'usage' ELSE 'sla_credit' END,
                       -sum(billed_cost), period_start, ?, 'fct_invoice_lines'
                FROM fct_invoice_lines
                WHERE period_grain = 'hour' AND period_start >= ? AND period_start < ?
                GROUP BY tenant_id, charge_category, period_start, period_start_utc
            """, [now, start, end])
            written = con.execute(
                "SELECT count(*) FROM billing_ledger WHERE kind IN ('usage', 'sla_credit')"
                " AND period_start >= ? AND period_start < ?", [start, end]).fetchone()[0]
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return int(written)


def tenant_spend(warehouse: Warehouse, now: dt.datetime) -> dict[str, TenantSpend]:
    """Balance and rated spend (today, this month) of every tenant with ledger or usage."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    frame = warehouse.query("""
        WITH ledger AS (SELECT tenant_id, sum(amount) AS balance FROM billing_ledger GROUP BY 1),
        spend AS (
            SELECT tenant_id,
                   sum(CASE WHEN period_start >= ? THEN billed_cost ELSE 0 END) AS today,
                   sum(billed_cost) AS month
            FROM fct_invoice_lines
            WHERE period_grain = 'hour' AND period_start >= ? AND period_start < ?
            GROUP BY 1)
        SELECT coalesce(l.tenant_id, s.tenant_id) AS tenant_id,
               coalesce(l.balance, 0) AS balance, coalesce(s.today, 0) AS today,
               coalesce(s.month, 0) AS month
        FROM ledger l FULL OUTER JOIN spend s USING (tenant_id)
    """, [day, month, now])
    return {t: TenantSpend(Decimal(b), Decimal(d), Decimal(m)) for t, b, d, m in frame.iter_rows()}


def evaluate_guards(accounts_: Iterable[Account], spend: Mapping[str, TenantSpend],
                    burn_per_hour: Mapping[str, Decimal], now: dt.datetime,
                    interval_seconds: int, grace_seconds: int) -> list[GuardVerdict]:
    """One verdict per guarded tenant: may it start tasks, must its running tasks drain?"""
    verdicts = []
    for account in accounts_:
        s = spend.get(account.tenant_id, TenantSpend(Decimal(0), Decimal(0), Decimal(0)))
        next_cost = (burn_per_hour.get(account.tenant_id, Decimal(0)) * interval_seconds / 3600)
        reasons = []
        available = None
        if account.prepaid:
            available = s.balance + account.credit_limit
            if available <= 0 or available < next_cost:
                reasons.append(f"balance {available:.2f} cannot cover the next interval ({next_cost:.2f})")
        if account.hard_cap_daily is not None and s.spent_today + next_cost > account.hard_cap_daily:
            reasons.append(f"daily hard cap {account.hard_cap_daily:.2f} reached"
                           f" (spent {s.spent_today:.2f} + next {next_cost:.2f})")
        if account.hard_cap_monthly is not None and s.spent_month + next_cost > account.hard_cap_monthly:
            reasons.append(f"monthly hard cap {account.hard_cap_monthly:.2f} reached"
                           f" (spent {s.spent_month:.2f} + next {next_cost:.2f})")
        blocked = bool(reasons)
        verdicts.append(GuardVerdict(
            tenant_id=account.tenant_id, admit_new_tasks=not blocked, drain_running=blocked,
            drain_after=now + dt.timedelta(seconds=grace_seconds) if blocked else None,
            balance=s.balance, available=available, next_interval_cost=next_cost,
            reasons=tuple(reasons)))
    return verdicts


def guard_decisions(verdicts: Sequence[GuardVerdict], running: Mapping[str, Sequence[tuple[str, str]]],
                    now: dt.datetime, shadow: bool) -> pl.DataFrame:
    """`decisions` rows: refuse_new_tasks per blocked tenant, drain per running task.

    `running` maps tenant -> [(task_id, pool_id)]. Ids are stable within the hour, so
    re-evaluating in the same hour rewrites rather than duplicates.
    """
    hour = now.astimezone(UTC).strftime("%Y-%m-%dT%H")
    rows = []
    for verdict in verdicts:
        if not verdict.drain_running:
            continue
        inputs = {"balance": str(verdict.balance), "available": None if verdict.available is None
                  else str(verdict.available), "next_interval_cost": str(verdict.next_interval_cost),
                  "drain_after": verdict.drain_after.isoformat() if verdict.drain_after else None}
        rows.append(_decision(f"budget:{verdict.tenant_id}:refuse:{hour}", None, verdict.tenant_id,
                              "refuse_new_tasks", verdict, inputs, now, shadow))
        for task_id, pool_id in running.get(verdict.tenant_id, ()):
            rows.append(_decision(f"budget:{verdict.tenant_id}:drain:{task_id}:{hour}", pool_id, task_id,
                                  "drain", verdict, {**inputs, "tenant_id": verdict.tenant_id}, now, shadow))
    return pl.DataFrame(rows, schema=DECISION_SCHEMA, orient="row") if rows else pl.DataFrame(schema=DECISION_SCHEMA)


DECISION_SCHEMA = {
    "decision_id": pl.Utf8, "kind": pl.Utf8, "pool_id": pl.Utf8, "target": pl.Utf8, "action": pl.Utf8,
    "allowed": pl.Boolean, "shadow": pl.Boolean, "reasons": pl.List(pl.Utf8), "inputs": pl.Utf8,
    "decided_at": pl.Datetime("us", "UTC"),
}


def _decision(decision_id: str, pool_id: str | None, target: str, action: str, verdict: GuardVerdict,
              inputs: dict, now: dt.datetime, shadow: bool) -> dict:
    import json

    return {"decision_id": decision_id, "kind": "budget_guard", "pool_id": pool_id, "target": target,
            "action": action, "allowed": True, "shadow": shadow, "reasons": list(verdict.reasons),
            "inputs": json.dumps(inputs), "decided_at": now}


def tenant_admission(warehouse: Warehouse, tenant_id: str, now: dt.datetime) -> tuple[bool, list[str]]:
    """May `tenant_id` start a task now? False while a budget guard refusal of this hour stands."""
    hour = now.astimezone(UTC).strftime("%Y-%m-%dT%H")
    frame = warehouse.query(
        "SELECT reasons FROM decisions WHERE kind = 'budget_guard' AND action = 'refuse_new_tasks'"
        " AND decision_id = ? AND NOT shadow", [f"budget:{tenant_id}:refuse:{hour}"])
    if frame.is_empty():
        return True, []
    return False, list(frame["reasons"][0])
