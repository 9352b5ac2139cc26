"""The billing ledger and accounts in the warehouse: the accounts read back, a payment booked
(its idempotency check and insert in one transaction), an invoice window posted (delete,
insert and count in one transaction), the balance and rated spend per tenant, a budget
refusal read back, and the rate card rewritten in one transaction. `billing.balances` and
`billing.rate_card` decide what to write; these functions only write and read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal

import polars as pl
import pyarrow as pa

from market_pipeline.warehouse.store import Warehouse

# (tenant_id, prepaid, credit_limit, hard_cap_daily, hard_cap_monthly)
AccountRow = tuple[str, bool, Decimal, Decimal | None, Decimal | None]
# (tenant_id, balance, spent today, spent this month)
SpendRow = tuple[str, Decimal, Decimal, Decimal]


def account_rows(warehouse: Warehouse) -> list[AccountRow]:
    """Every billing account, by tenant id."""
    frame = warehouse.query(
        "SELECT tenant_id, prepaid, credit_limit, hard_cap_daily, hard_cap_monthly"
        " FROM billing_accounts ORDER BY tenant_id"
    )
    return list(frame.iter_rows())


def book_payment(
    warehouse: Warehouse, tenant_id: str, kind: str, row: pa.Table, same_payment: Callable[[str | None], bool]
) -> tuple[Decimal] | None:
    """Book `row` (one ledger row) unless the tenant already has a `kind` entry whose reference
    `same_payment` recognises; the check and the insert share one write transaction. Returns
    the booked entry's (amount,) when one was found (and nothing was written), else None."""
    with warehouse.connect() as con:
        con.execute("BEGIN")
        try:
            # the same payment under any spelling of its reference, rows booked before
            # references were normalised included
            booked = next(
                (
                    (amount,)
                    for amount, ref in con.execute(
                        "SELECT amount, reference FROM billing_ledger WHERE tenant_id = ? AND kind = ?",
                        [tenant_id, kind],
                    ).fetchall()
                    if same_payment(ref)
                ),
                None,
            )
            if booked is None:
                con.register("_payment", row)
                con.execute(
                    "INSERT INTO billing_ledger SELECT entry_id, tenant_id, kind,"
                    " CAST(amount AS DECIMAL(20, 9)), period_start, recorded_at, reference FROM _payment"
                )
                con.unregister("_payment")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return booked


def post_invoice_window(warehouse: Warehouse, start: datetime, end: datetime, now: datetime) -> int:
    """Replace the ledger's posted entries (usage debits, SLA credits) for hours in [start, end)
    from the hourly invoice lines, in one transaction. Returns the entries the window holds."""
    with warehouse.connect() as con:
        con.execute("BEGIN")
        try:
            con.execute(
                "DELETE FROM billing_ledger WHERE kind IN ('usage', 'sla_credit')"
                " AND period_start >= ? AND period_start < ?",
                [start, end],
            )
            con.execute(
                """
                INSERT INTO billing_ledger
                SELECT CASE charge_category WHEN 'Usage' THEN 'usage' ELSE 'sla_credit' END
                           || ':' || tenant_id || ':' || strftime(period_start_utc, '%Y-%m-%dT%H:%M:%S'),
                       tenant_id,
                       CASE charge_category WHEN 'Usage' THEN 'usage' ELSE 'sla_credit' END,
                       -sum(billed_cost), period_start, ?, 'fct_invoice_lines'
                FROM fct_invoice_lines
                WHERE period_grain = 'hour' AND period_start >= ? AND period_start < ?
                GROUP BY tenant_id, charge_category, period_start, period_start_utc
            """,
                [now, start, end],
            )
            written = con.execute(
                "SELECT count(*) FROM billing_ledger WHERE kind IN ('usage', 'sla_credit')"
                " AND period_start >= ? AND period_start < ?",
                [start, end],
            ).fetchone()[0]
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return int(written)


def spend_rows(warehouse: Warehouse, day: datetime, month: datetime, now: datetime) -> list[SpendRow]:
    """Per tenant with ledger entries or rated usage: the ledger's sum and the hourly billed
    cost from `day` and from `month` up to `now` (nothing spent before the first rollup)."""
    rated = not warehouse.query(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = 'main'"
        " AND table_name = 'fct_invoice_lines'"
    ).is_empty()
    # before the first billing rollup there are no invoice lines yet: nothing is spent
    lines = (
        "fct_invoice_lines"
        if rated
        else "(SELECT NULL::VARCHAR AS tenant_id, NULL::VARCHAR AS period_grain,"
        " NULL::TIMESTAMPTZ AS period_start, NULL::DECIMAL(20, 9) AS billed_cost WHERE false)"
    )
    frame = warehouse.query(
        f"""
        WITH ledger AS (SELECT tenant_id, sum(amount) AS balance FROM billing_ledger GROUP BY 1),
        spend AS (
            SELECT tenant_id,
                   sum(CASE WHEN period_start >= ? THEN billed_cost ELSE 0 END) AS today,
                   sum(billed_cost) AS month
            FROM {lines}
            WHERE period_grain = 'hour' AND period_start >= ? AND period_start < ?
            GROUP BY 1)
        SELECT coalesce(l.tenant_id, s.tenant_id) AS tenant_id,
               coalesce(l.balance, 0) AS balance, coalesce(s.today, 0) AS today,
               coalesce(s.month, 0) AS month
        FROM ledger l FULL OUTER JOIN spend s USING (tenant_id)
    """,
        [day, month, now],
    )
    return list(frame.iter_rows())


def live_decision_reasons(warehouse: Warehouse, kind: str, action: str, decision_id: str) -> list[str] | None:
    """The reasons of live decision `decision_id` of `kind` and `action`; None when there is none."""
    frame = warehouse.query(
        "SELECT reasons FROM decisions WHERE kind = ? AND action = ? AND decision_id = ? AND NOT shadow",
        [kind, action, decision_id],
    )
    if frame.is_empty():
        return None
    return list(frame["reasons"][0])


def rewrite_rate_card(warehouse: Warehouse, tables: Mapping[str, pl.DataFrame]) -> None:
    """Every rate card table emptied and written from `tables`, in one transaction."""
    with warehouse.connect() as con:
        con.execute("BEGIN")
        try:
            for table, frame in tables.items():
                con.execute(f"DELETE FROM {table}")
                warehouse.append(table, frame, con=con)
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
