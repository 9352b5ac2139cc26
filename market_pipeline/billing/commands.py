"""Billing subcommands: quote, cost-report, billing-rollup, balance, tenant-sql (bench billing: `lab.billing`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path

from market_pipeline.billing.errors import BillingError
from market_pipeline.cli.support import number
from market_pipeline.cli.warehouse_options import (
    add_limit_arguments,
    add_warehouse_argument,
    limits_from,
    warehouse_path,
)
from market_pipeline.config import ConfigError, load_config
from market_pipeline.warehouse import Warehouse, WarehouseError, open_warehouse
from market_pipeline.warehouse.sql_guard import SqlRefused, check_read_only


def register(sub: argparse._SubParsersAction) -> None:
    quote = sub.add_parser("quote", help="expected cost of GPUs for hours, with a 90%% band")
    quote.add_argument("--tenant", required=True)
    quote.add_argument("--pool", required=True, help="pool id, e.g. A100-80GB@cn-hangzhou-a")
    quote.add_argument("--gpus", type=number(float, low=0, low_open=True), required=True)
    quote.add_argument("--hours", type=number(float, low=0, low_open=True), required=True)
    quote.add_argument(
        "--class", dest="resource_class", choices=("guaranteed", "drainable"), default="guaranteed"
    )
    quote.add_argument("--start", help="ISO start time (default: now, UTC)")
    add_warehouse_argument(quote)
    quote.add_argument("--json", action="store_true")
    quote.set_defaults(handler=run_quote)

    report = sub.add_parser("cost-report", help="render a tenant's cost breakdown and price history")
    report.add_argument("--tenant", required=True)
    report.add_argument("--format", choices=("html", "png"), default="html")
    report.add_argument("--out", help="output file (default: reports/cost-report-TENANT.FORMAT)")
    add_warehouse_argument(report)
    report.add_argument("--json", action="store_true")
    report.set_defaults(handler=run_cost_report)

    rollup = sub.add_parser("billing-rollup", help="refresh the rate card and build the billing marts")
    rollup.add_argument("--start", help="ISO hour, window start (default: all hours)")
    rollup.add_argument("--end", help="ISO hour, window end (exclusive)")
    rollup.add_argument("--no-tests", action="store_true", help="dbt run instead of dbt build")
    add_warehouse_argument(rollup)
    rollup.set_defaults(handler=run_rollup)

    balance = sub.add_parser("balance", help="show or manage a tenant's billing account and balance")
    balance.add_argument("--tenant", required=True)
    balance.add_argument("--top-up", help="add this amount to the balance (needs --reference)")
    balance.add_argument("--reference", help="payment reference (makes a top-up idempotent)")
    balance.add_argument("--prepaid", choices=("yes", "no"), help="set the account type")
    balance.add_argument("--credit-limit")
    balance.add_argument("--hard-cap-daily", help="daily spend cap, or 'none' to remove it")
    balance.add_argument("--hard-cap-monthly", help="monthly spend cap, or 'none' to remove it")
    add_warehouse_argument(balance)
    balance.set_defaults(handler=run_balance)

    tenant_sql = sub.add_parser("tenant-sql", help="run SQL that can only see one tenant's billing rows")
    tenant_sql.add_argument("--tenant", required=True)
    tenant_sql.add_argument("query")
    add_warehouse_argument(tenant_sql)
    add_limit_arguments(tenant_sql)
    tenant_sql.set_defaults(handler=run_tenant_sql)


def _time(text: str | None, name: str) -> dt.datetime | None:
    if text is None:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise BillingError(f"--{name} {text!r} is not an ISO time") from exc
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _decimal(text: str | None, name: str) -> Decimal | None:
    from market_pipeline.billing.balances import check_amount

    if text is None:
        return None
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise BillingError(f"--{name} {text!r} is not a number") from None
    return check_amount(value, f"--{name}")


def _keep(new: Decimal | None, current: Decimal) -> Decimal:
    return current if new is None else new


def _cap(text: str | None, name: str, current: Decimal | None) -> Decimal | None:
    """A cap from the command line: unchanged when absent, removed by "none"."""
    if text is None:
        return current
    return None if text.lower() == "none" else _decimal(text, name)


def _plain(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def _fail(exc: Exception) -> int:
    print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the cause
    return 2


def run_quote(args: argparse.Namespace) -> int:
    from market_pipeline.billing.quotes import quote

    try:
        config = load_config()
        path = warehouse_path(args.warehouse)
        if args.warehouse and not path.is_file():  # a named warehouse must be there: no silent bounds
            raise WarehouseError(f"warehouse {path} does not exist or is not a file")
        warehouse = Warehouse(path) if path.exists() else None
        result = quote(
            config,
            warehouse,
            args.tenant,
            args.pool,
            args.gpus,
            args.hours,
            args.resource_class,
            _time(args.start, "start"),
        )
    except (BillingError, ConfigError, WarehouseError) as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(result.as_json()))
    else:
        print(
            f"{result.tenant_id} {result.gpus} x {result.pool_id} ({result.resource_class}) for"
            f" {result.hours} h: {result.expected_cost} {result.currency}"
            f" (90%: {result.low_90} .. {result.high_90}, {result.band_method})"
        )
    return 0


# What a tenant id may look like where it names a file: no separators, no leading dot.
SAFE_TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _known_tenants(warehouse: Warehouse) -> set[str]:
    """The configured tenants and those with a billing account in the warehouse."""
    from market_pipeline.billing.balances import accounts

    known = {t.id for t in load_config().tenants}
    if warehouse.path.is_file():
        known |= {a.tenant_id for a in accounts(warehouse)}
    return known


def run_cost_report(args: argparse.Namespace) -> int:
    from market_pipeline.billing.cost_report import write_report

    try:
        if not SAFE_TENANT_ID.fullmatch(args.tenant):
            raise BillingError(
                f"tenant id {args.tenant!r} is not a tenant id (letters, digits, '.', '_', '-'; no paths)"
            )
        warehouse = Warehouse(warehouse_path(args.warehouse))
        known = _known_tenants(warehouse)
        if args.tenant not in known:
            raise BillingError(f"unknown tenant {args.tenant!r}; known: {sorted(known)}")
        out = Path(args.out) if args.out else Path("reports") / f"cost-report-{args.tenant}.{args.format}"
        path = write_report(warehouse, args.tenant, out, args.format)
    except (BillingError, ConfigError, WarehouseError) as exc:
        return _fail(exc)
    print(
        json.dumps({"tenant": args.tenant, "format": args.format, "path": str(path)})
        if args.json
        else f"wrote {path}"
    )
    return 0


def run_rollup(args: argparse.Namespace) -> int:
    from market_pipeline.billing.rollup import rollup_window

    try:
        config = load_config()
        warehouse = open_warehouse(warehouse_path(args.warehouse))
        result = rollup_window(
            warehouse, config, _time(args.start, "start"), _time(args.end, "end"), run_tests=not args.no_tests
        )
    except (BillingError, ConfigError, WarehouseError) as exc:
        return _fail(exc)
    print(json.dumps({"seconds": round(result.dbt.seconds, 3), "ledger_entries": result.ledger_entries}))
    return 0


def run_balance(args: argparse.Namespace) -> int:
    from market_pipeline.billing.balances import (
        Account,
        accounts,
        check_account,
        record_payment,
        set_account,
        tenant_spend,
    )

    try:
        # every argument is checked before anything is written: nothing is half-applied
        top_up = _decimal(args.top_up, "top-up")
        credit_limit = _decimal(args.credit_limit, "credit-limit")
        changes = [args.prepaid, args.credit_limit, args.hard_cap_daily, args.hard_cap_monthly]
        path = warehouse_path(args.warehouse)
        if top_up is None and all(v is None for v in changes) and not path.is_file():
            raise WarehouseError(f"warehouse {path} does not exist or is not a file (nothing to show)")
        warehouse = open_warehouse(path)
        known = {t.id for t in load_config().tenants} | {a.tenant_id for a in accounts(warehouse)}
        if (top_up is not None or any(v is not None for v in changes)) and args.tenant not in known:
            raise BillingError(f"unknown tenant {args.tenant!r}; known: {sorted(known)}")
        account_change = None
        if any(value is not None for value in changes):
            current = next(
                (a for a in accounts(warehouse) if a.tenant_id == args.tenant),
                Account(args.tenant, prepaid=True),
            )
            account_change = Account(
                args.tenant,
                prepaid=current.prepaid if args.prepaid is None else args.prepaid == "yes",
                credit_limit=_keep(credit_limit, current.credit_limit),
                hard_cap_daily=_cap(args.hard_cap_daily, "hard-cap-daily", current.hard_cap_daily),
                hard_cap_monthly=_cap(args.hard_cap_monthly, "hard-cap-monthly", current.hard_cap_monthly),
            )
            check_account(account_change)
        if top_up is not None:
            record_payment(warehouse, args.tenant, top_up, args.reference or "", known_tenants=known)
        if account_change is not None:
            set_account(warehouse, account_change)
        spend = tenant_spend(warehouse, dt.datetime.now(dt.timezone.utc)).get(args.tenant)
        account = next((a for a in accounts(warehouse) if a.tenant_id == args.tenant), None)
    except (BillingError, ConfigError, WarehouseError) as exc:
        return _fail(exc)
    print(
        json.dumps(
            {
                "tenant": args.tenant,
                "guarded": account is not None,
                "prepaid": account.prepaid if account else None,
                "balance": _plain(spend.balance) if spend else "0",
                "spent_today": _plain(spend.spent_today) if spend else "0",
                "spent_month": _plain(spend.spent_month) if spend else "0",
                "credit_limit": _plain(account.credit_limit) if account else None,
                "hard_cap_daily": _plain(account.hard_cap_daily) if account else None,
                "hard_cap_monthly": _plain(account.hard_cap_monthly) if account else None,
            }
        )
    )
    return 0


def run_tenant_sql(args: argparse.Namespace) -> int:
    from market_pipeline.billing.tenant_scope import TenantScopeError, render_tenant_query
    from market_pipeline.warehouse.isolated import run_isolated

    try:
        limits = limits_from(args)
        if not args.tenant.strip():
            raise TenantScopeError("tenant id must be a non-empty string")
        try:
            check_read_only(args.query)  # refused before any process starts
        except SqlRefused as exc:
            raise TenantScopeError(f"tenant {args.tenant!r} query refused: {exc}") from None
        path = warehouse_path(args.warehouse)
        if not path.is_file():
            raise WarehouseError(f"warehouse {path} does not exist or is not a file")
        text = run_isolated(render_tenant_query, (str(path), args.tenant, args.query), limits)
    except (BillingError, ConfigError, WarehouseError, SqlRefused) as exc:
        return _fail(exc)
    print(text)
    return 0
