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
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import polars as pl
import pyarrow as pa

from market_pipeline.billing.errors import BillingError
from market_pipeline.warehouse import Warehouse, billing_ledger
from market_pipeline.warehouse.decision_inputs import BudgetGuardInputs
from market_pipeline.warehouse.decisions import DecisionAction, DecisionKind, DecisionRow, decisions_frame

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


def check_account(account: Account) -> Account:
    """BillingError unless the limits are finite, in the ledger's range and not negative."""
    check_amount(account.credit_limit, "credit_limit")
    if account.credit_limit < 0:
        raise BillingError(f"credit_limit must be >= 0, got {account.credit_limit}")
    for name in ("hard_cap_daily", "hard_cap_monthly"):
        cap = getattr(account, name)
        if cap is not None and check_amount(cap, name) < 0:
            raise BillingError(f"{name} must be >= 0, got {cap}")
    return account


def set_account(warehouse: Warehouse, account: Account, now: dt.datetime | None = None) -> None:
    check_account(account)
    warehouse.upsert(
        "billing_accounts",
        pl.DataFrame(
            [
                {
                    "tenant_id": account.tenant_id,
                    "prepaid": account.prepaid,
                    "credit_limit": account.credit_limit,
                    "hard_cap_daily": account.hard_cap_daily,
                    "hard_cap_monthly": account.hard_cap_monthly,
                    "updated_at": now or dt.datetime.now(UTC),
                }
            ],
            schema={
                "tenant_id": pl.Utf8,
                "prepaid": pl.Boolean,
                "credit_limit": pl.Decimal(20, 9),
                "hard_cap_daily": pl.Decimal(20, 9),
                "hard_cap_monthly": pl.Decimal(20, 9),
                "updated_at": pl.Datetime("us", "UTC"),
            },
        ),
    )


def accounts(warehouse: Warehouse) -> list[Account]:
    return [Account(*row) for row in billing_ledger.account_rows(warehouse)]


# billing_ledger.amount is DECIMAL(20, 9): 11 integer digits, 9 decimals.
MAX_LEDGER_AMOUNT = Decimal("99999999999")
LEDGER_SCALE = 9


def check_amount(amount: Decimal, name: str = "amount") -> Decimal:
    """A finite amount the ledger column holds exactly; BillingError naming it otherwise."""
    if not isinstance(amount, Decimal) or not amount.is_finite():
        raise BillingError(f"{name} must be a finite number, got {amount}")
    if abs(amount) > MAX_LEDGER_AMOUNT:
        raise BillingError(f"{name} {amount} is beyond the ledger's range (at most {MAX_LEDGER_AMOUNT})")
    if amount != amount.quantize(Decimal(1).scaleb(-LEDGER_SCALE)):
        raise BillingError(f"{name} {amount} has more than {LEDGER_SCALE} decimals")
    return amount


def payment_reference(text: str) -> str:
    """A payment reference as the ledger keys it: outer blanks stripped, inner runs of blanks one
    space, case folded; "r1 ", "R1" and "r1" are one payment."""
    return " ".join(text.split()).casefold()


def record_payment(
    warehouse: Warehouse,
    tenant_id: str,
    amount: Decimal,
    reference: str,
    kind: str = "top_up",
    now: dt.datetime | None = None,
    known_tenants: Collection[str] | None = None,
) -> str:
    """A top-up (or signed adjustment), keyed by `reference`. Returns the entry id.

    The reference (normalised by `payment_reference`) is an idempotency key, never an update: replaying it with the same amount
    changes nothing, and with another amount is refused naming both (a payment once booked
    cannot be rewritten). The check and the insert share one write transaction, and DuckDB
    admits one writing process at a time, so concurrent replays book exactly one entry.
    `known_tenants`, when given, is the set a payment may be booked for.
    """
    if kind not in MANUAL_KINDS:
        raise BillingError(f"ledger kind must be one of {MANUAL_KINDS}, got {kind!r}")
    if not tenant_id:
        raise BillingError("a payment needs a tenant id")
    if known_tenants is not None and tenant_id not in known_tenants:
        raise BillingError(f"unknown tenant {tenant_id!r}; known: {sorted(known_tenants)}")
    check_amount(amount, "the amount")
    if kind == "top_up" and amount <= 0:
        raise BillingError(f"a top-up must be positive, got {amount}")
    if not reference or not reference.strip():
        raise BillingError("a payment needs a reference (it makes the entry idempotent)")
    reference = payment_reference(reference)
    entry_id = f"{kind}:{tenant_id}:{reference}"
    row = pa.table(
        {
            "entry_id": [entry_id],
            "tenant_id": [tenant_id],
            "kind": [kind],
            "amount": [str(amount)],
            "period_start": pa.array([None], pa.timestamp("us", "UTC")),
            "recorded_at": pa.array([now or dt.datetime.now(UTC)], pa.timestamp("us", "UTC")),
            "reference": [reference],
        }
    )
    booked = billing_ledger.book_payment(
        warehouse, tenant_id, kind, row, lambda ref: payment_reference(ref or "") == reference
    )
    if booked is not None and Decimal(booked[0]) != amount:
        raise BillingError(
            f"reference {reference!r} of tenant {tenant_id!r} is already booked as"
            f" {format(Decimal(booked[0]).normalize(), 'f')}; refusing {format(amount, 'f')}"
            " (a payment cannot be rewritten; use a new reference)"
        )
    return entry_id


def post_invoice_window(
    warehouse: Warehouse, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None
) -> int:
    """Replace the ledger's posted entries for hours in [start, end) from the invoice lines."""
    now = now or dt.datetime.now(UTC)
    return billing_ledger.post_invoice_window(warehouse, start, end, now)


def tenant_spend(warehouse: Warehouse, now: dt.datetime) -> dict[str, TenantSpend]:
    """Balance and rated spend (today, this month) of every tenant with ledger or usage."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    rows = billing_ledger.spend_rows(warehouse, day, month, now)
    return {t: TenantSpend(Decimal(b), Decimal(d), Decimal(m)) for t, b, d, m in rows}


def evaluate_guards(
    accounts_: Iterable[Account],
    spend: Mapping[str, TenantSpend],
    burn_per_hour: Mapping[str, Decimal],
    now: dt.datetime,
    interval_seconds: int,
    grace_seconds: int,
) -> list[GuardVerdict]:
    """One verdict per guarded tenant: may it start tasks, must its running tasks drain?"""
    verdicts = []
    for account in accounts_:
        s = spend.get(account.tenant_id, TenantSpend(Decimal(0), Decimal(0), Decimal(0)))
        next_cost = burn_per_hour.get(account.tenant_id, Decimal(0)) * interval_seconds / 3600
        reasons = []
        available = None
        if account.prepaid:
            available = s.balance + account.credit_limit
            if available <= 0 or available < next_cost:
                reasons.append(f"balance {available:.2f} cannot cover the next interval ({next_cost:.2f})")
        if account.hard_cap_daily is not None and s.spent_today + next_cost > account.hard_cap_daily:
            reasons.append(
                f"daily hard cap {account.hard_cap_daily:.2f} reached"
                f" (spent {s.spent_today:.2f} + next {next_cost:.2f})"
            )
        if account.hard_cap_monthly is not None and s.spent_month + next_cost > account.hard_cap_monthly:
            reasons.append(
                f"monthly hard cap {account.hard_cap_monthly:.2f} reached"
                f" (spent {s.spent_month:.2f} + next {next_cost:.2f})"
            )
        blocked = bool(reasons)
        verdicts.append(
            GuardVerdict(
                tenant_id=account.tenant_id,
                admit_new_tasks=not blocked,
                drain_running=blocked,
                drain_after=now + dt.timedelta(seconds=grace_seconds) if blocked else None,
                balance=s.balance,
                available=available,
                next_interval_cost=next_cost,
                reasons=tuple(reasons),
            )
        )
    return verdicts


def guard_decisions(
    verdicts: Sequence[GuardVerdict],
    running: Mapping[str, Sequence[tuple[str, str]]],
    now: dt.datetime,
    shadow: bool,
) -> pl.DataFrame:
    """`decisions` rows: refuse_new_tasks per blocked tenant, drain per running task.

    `running` maps tenant -> [(task_id, pool_id)]. Ids are stable within the hour, so
    re-evaluating in the same hour rewrites rather than duplicates.
    """
    hour = now.astimezone(UTC).strftime("%Y-%m-%dT%H")
    rows = []
    for verdict in verdicts:
        if not verdict.drain_running:
            continue
        inputs = BudgetGuardInputs(
            verdict.balance, verdict.available, verdict.next_interval_cost, verdict.drain_after
        )
        rows.append(
            _decision(
                f"budget:{verdict.tenant_id}:refuse:{hour}",
                None,
                verdict.tenant_id,
                DecisionAction.REFUSE_NEW_TASKS,
                verdict,
                inputs,
                now,
                shadow,
            )
        )
        for task_id, pool_id in running.get(verdict.tenant_id, ()):
            rows.append(
                _decision(
                    f"budget:{verdict.tenant_id}:drain:{task_id}:{hour}",
                    pool_id,
                    task_id,
                    DecisionAction.DRAIN,
                    verdict,
                    inputs.for_tenant(verdict.tenant_id),
                    now,
                    shadow,
                )
            )
    return decisions_frame(rows)


def _decision(
    decision_id: str,
    pool_id: str | None,
    target: str,
    action: DecisionAction,
    verdict: GuardVerdict,
    inputs: BudgetGuardInputs,
    now: dt.datetime,
    shadow: bool,
) -> DecisionRow:
    return DecisionRow(
        decision_id=decision_id,
        kind=DecisionKind.BUDGET_GUARD,
        action=action,
        decided_at=now,
        allowed=True,
        shadow=shadow,
        pool_id=pool_id,
        target=target,
        reasons=tuple(verdict.reasons),
        inputs=inputs,
    )


def tenant_admission(warehouse: Warehouse, tenant_id: str, now: dt.datetime) -> tuple[bool, list[str]]:
    """May `tenant_id` start a task now? False while a budget guard refusal of this hour stands."""
    hour = now.astimezone(UTC).strftime("%Y-%m-%dT%H")
    reasons = billing_ledger.live_decision_reasons(
        warehouse,
        DecisionKind.BUDGET_GUARD.value,
        DecisionAction.REFUSE_NEW_TASKS.value,
        f"budget:{tenant_id}:refuse:{hour}",
    )
    if reasons is None:
        return True, []
    return False, reasons
