"""The ledger: a payment reference is an idempotency key, under concurrent replays too."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from hardening_kit import REPO_ROOT, TENANT, build_warehouse, run_cli

from market_pipeline.billing.balances import record_payment
from market_pipeline.billing.errors import BillingError
from market_pipeline.warehouse import Warehouse


def _entries(path: Path, reference: str) -> list[Decimal]:
    with duckdb.connect(str(path), read_only=True) as con:
        return [
            row[0]
            for row in con.execute(
                "SELECT amount FROM billing_ledger WHERE reference = ?", [reference]
            ).fetchall()
        ]


def test_hardening_replay_is_a_no_op_and_another_amount_is_refused(tmp_path: Path) -> None:
    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    first = record_payment(warehouse, TENANT, Decimal("10"), "r6")
    assert record_payment(warehouse, TENANT, Decimal("10.00"), "r6") == first
    with pytest.raises(BillingError, match=r"booked as 10; refusing 99"):
        record_payment(warehouse, TENANT, Decimal("99"), "r6")
    assert _entries(warehouse.path, "r6") == [Decimal("10")]
    with pytest.raises(BillingError, match="unknown tenant 'nobody'"):
        record_payment(warehouse, "nobody", Decimal("1"), "r9", known_tenants={TENANT})
    for bad in ("NaN", "Infinity", "-Infinity", "1e30", "1e-12"):
        with pytest.raises(BillingError):
            record_payment(warehouse, TENANT, Decimal(bad), "r9")
    assert _entries(warehouse.path, "r9") == []


def test_hardening_a_replay_with_a_smaller_amount_is_refused_too(tmp_path: Path) -> None:
    """A reference once booked keeps its amount: less is refused as firmly as more, and an
    adjustment replayed with the other sign as well."""
    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    record_payment(warehouse, TENANT, Decimal("10"), "r7")
    with pytest.raises(
        BillingError, match=r"'r7' of tenant 'acme-research' is already booked as 10; refusing 9.99"
    ):
        record_payment(warehouse, TENANT, Decimal("9.99"), "r7")
    assert _entries(warehouse.path, "r7") == [Decimal("10")]
    record_payment(warehouse, TENANT, Decimal("-2.5"), "fix-1", kind="adjustment")
    with pytest.raises(BillingError, match=r"booked as -2.5; refusing 2.5"):
        record_payment(warehouse, TENANT, Decimal("2.5"), "fix-1", kind="adjustment")
    assert _entries(warehouse.path, "fix-1") == [Decimal("-2.5")]


def test_hardening_balance_cli_refuses_unknown_tenants_and_bad_amounts(tmp_path: Path) -> None:
    path = build_warehouse(tmp_path / "w.duckdb")
    code, _, err = run_cli(
        "balance", "--tenant", "nobody", "--top-up", "5", "--reference", "x", "--warehouse", str(path)
    )
    assert code == 2 and "unknown tenant 'nobody'" in err
    code, _, err = run_cli(
        "balance", "--tenant", TENANT, "--top-up", "nan", "--reference", "x", "--warehouse", str(path)
    )
    assert code == 2 and err.strip() == "error: --top-up must be a finite number, got NaN"
    code, _, err = run_cli(
        "balance", "--tenant", TENANT, "--top-up", "inf", "--reference", "x", "--warehouse", str(path)
    )
    assert code == 2 and "finite" in err
    assert _entries(path, "x") == []


REPLAY = """
import sys
from decimal import Decimal
from pathlib import Path
from market_pipeline.billing.balances import record_payment
from market_pipeline.billing.errors import BillingError
from market_pipeline.warehouse import Warehouse
# the six wait out each other's file lock: retried every 50 ms, not after up to a second
warehouse = Warehouse(Path(sys.argv[1]), lock_retry_max_delay=0.05)
try:
    record_payment(warehouse, sys.argv[2], Decimal(sys.argv[3]), "wire-c")
except BillingError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def test_hardening_concurrent_replays_book_exactly_one_entry(tmp_path: Path) -> None:
    """Six processes replay one reference at once, four with 10 and two with 99."""
    path = build_warehouse(tmp_path / "w.duckdb")
    amounts = ["10", "99", "10", "10", "99", "10"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REPLAY, str(path), TENANT, amount],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for amount in amounts
    ]
    results = [(amount, p.wait(timeout=120), p.stderr.read()) for amount, p in zip(amounts, procs)]
    booked = _entries(path, "wire-c")
    assert len(booked) == 1
    winner = format(booked[0].normalize(), "f")
    for amount, code, err in results:
        assert "Traceback" not in err
        if amount == winner:
            assert code == 0, err  # the booking, or a replay of it: a no-op
        else:
            assert code == 2 and f"booked as {winner}; refusing {amount}" in err


@pytest.mark.parametrize(
    ("tenant", "amount", "reference", "kind", "message"),
    [
        (TENANT, "5", "r1", "refund", "ledger kind must be one of ('top_up', 'adjustment'), got 'refund'"),
        ("", "5", "r1", "top_up", "a payment needs a tenant id"),
        (TENANT, "0", "r1", "top_up", "a top-up must be positive, got 0"),
        (TENANT, "-1", "r1", "top_up", "a top-up must be positive, got -1"),
        (TENANT, "5", "   ", "top_up", "a payment needs a reference"),
        (TENANT, "5", "", "top_up", "a payment needs a reference"),
        (TENANT, "100000000000", "r1", "top_up", "the amount 100000000000 is beyond the ledger's range"),
        (TENANT, "0.0000000001", "r1", "adjustment", "the amount 1E-10 has more than 9 decimals"),
    ],
)
def test_hardening_a_payment_the_ledger_cannot_hold_is_refused_and_books_nothing(
    tmp_path: Path, tenant: str, amount: str, reference: str, kind: str, message: str
) -> None:
    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    with pytest.raises(BillingError) as refused:
        record_payment(warehouse, tenant, Decimal(amount), reference, kind=kind)
    assert str(refused.value).startswith(message)
    assert _entries(warehouse.path, reference) == []


def test_hardening_the_ledger_books_the_extremes_it_can_hold(tmp_path: Path) -> None:
    """The largest amount, nine decimals and a negative adjustment are booked exactly."""
    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    assert record_payment(warehouse, TENANT, Decimal("99999999999"), "big") == f"top_up:{TENANT}:big"
    record_payment(warehouse, TENANT, Decimal("0.000000001"), "tiny", known_tenants={TENANT})
    assert record_payment(warehouse, TENANT, Decimal("-99999999999"), "fix", kind="adjustment") == (
        f"adjustment:{TENANT}:fix"
    )
    assert _entries(warehouse.path, "big") == [Decimal("99999999999")]
    assert _entries(warehouse.path, "tiny") == [Decimal("0.000000001")]
    assert _entries(warehouse.path, "fix") == [Decimal("-99999999999")]


def test_hardening_account_limits_are_checked_before_they_are_stored() -> None:
    from market_pipeline.billing.balances import Account, check_account

    assert check_account(Account("t", prepaid=True)).credit_limit == 0
    zero_caps = Account("t", prepaid=False, hard_cap_daily=Decimal(0), hard_cap_monthly=Decimal(0))
    assert check_account(zero_caps) is zero_caps
    with pytest.raises(BillingError, match=r"^credit_limit must be >= 0, got -1$"):
        check_account(Account("t", prepaid=True, credit_limit=Decimal(-1)))
    with pytest.raises(BillingError, match=r"^credit_limit must be a finite number, got NaN$"):
        check_account(Account("t", prepaid=True, credit_limit=Decimal("NaN")))
    for name in ("hard_cap_daily", "hard_cap_monthly"):
        with pytest.raises(BillingError, match=rf"^{name} must be >= 0, got -0.01$"):
            check_account(Account("t", prepaid=False, **{name: Decimal("-0.01")}))
        with pytest.raises(BillingError, match=rf"^{name} 1E\+12 is beyond the ledger's range"):
            check_account(Account("t", prepaid=False, **{name: Decimal("1E12")}))


@pytest.mark.usefixtures("host_in_kolkata")
def test_hardening_a_reference_is_booked_in_its_normal_form_and_replays_under_any_spelling(
    tmp_path: Path,
) -> None:
    """The ledger keeps the reference as it keys it (blanks folded to one space, case
    folded) and the time the payment was recorded at, also on a host whose clock is set to
    +05:30; any spelling of it is the same payment."""
    import datetime as dt

    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    at = dt.datetime(2026, 3, 2, 12, 30, tzinfo=dt.timezone.utc)
    first = record_payment(warehouse, TENANT, Decimal("10"), "  Wire \t 42 ", now=at)
    assert first == f"top_up:{TENANT}:wire 42"
    assert record_payment(warehouse, TENANT, Decimal("10"), "WIRE 42") == first
    assert _entries(warehouse.path, "wire 42") == [Decimal("10")]
    before = dt.datetime.now(dt.timezone.utc)
    record_payment(warehouse, TENANT, Decimal("5"), "wire 43")
    with duckdb.connect(str(warehouse.path), read_only=True) as con:
        recorded = dict(con.execute("SELECT reference, recorded_at FROM billing_ledger").fetchall())
    assert recorded["wire 42"] == at
    assert before - dt.timedelta(seconds=1) <= recorded["wire 43"] <= dt.datetime.now(dt.timezone.utc)


@pytest.mark.parametrize(
    ("amount", "shown"),
    [("10.000000001", "10.000000001"), ("1E+2", "100"), ("-10", "-10"), ("0.5", "0.5")],
)
def test_hardening_a_replayed_reference_is_refused_whatever_other_amount_it_carries(
    tmp_path: Path, amount: str, shown: str
) -> None:
    """One nanounit more, another spelling of a larger amount, the other sign: each is a
    rewrite of the booked payment and is refused, the message naming both in plain digits."""
    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    kind = "adjustment" if amount.startswith("-") else "top_up"
    record_payment(warehouse, TENANT, Decimal("10"), "r8", kind=kind)
    with pytest.raises(BillingError) as refused:
        record_payment(warehouse, TENANT, Decimal(amount), "R8", kind=kind)
    assert str(refused.value) == (
        f"reference 'r8' of tenant {TENANT!r} is already booked as 10; refusing {shown}"
        " (a payment cannot be rewritten; use a new reference)"
    )
    assert _entries(warehouse.path, "r8") == [Decimal("10")]


def test_hardening_a_top_up_and_an_adjustment_or_another_tenant_may_share_a_reference(
    tmp_path: Path,
) -> None:
    """The idempotency key is (tenant, kind, reference): the same words under another kind or
    tenant are another payment, booked beside the first."""
    warehouse = Warehouse(build_warehouse(tmp_path / "w.duckdb"))
    record_payment(warehouse, TENANT, Decimal("10"), "inv-7")
    record_payment(warehouse, TENANT, Decimal("-3"), "inv-7", kind="adjustment")
    record_payment(warehouse, "other-tenant", Decimal("4"), "inv-7")
    assert sorted(_entries(warehouse.path, "inv-7")) == [Decimal("-3"), Decimal("4"), Decimal("10")]


def test_hardening_rows_booked_before_references_were_normalised_still_key_their_payment(
    tmp_path: Path,
) -> None:
    """A row from before the ledger normalised references ("Wire  9") is the same payment as
    "wire 9": replayed it is a no-op, rewritten it is refused. A row with no reference at all
    is no payment's: a new reference, whatever its spelling, is booked beside it."""
    path = build_warehouse(tmp_path / "w.duckdb")
    with duckdb.connect(str(path)) as con:
        con.execute(
            "INSERT INTO billing_ledger VALUES"
            f" ('top_up:{TENANT}:legacy', '{TENANT}', 'top_up', 9, NULL, now(), 'Wire  9'),"
            f" ('top_up:{TENANT}:unkeyed', '{TENANT}', 'top_up', 3, NULL, now(), NULL)"
        )
    warehouse = Warehouse(path)
    assert record_payment(warehouse, TENANT, Decimal("9"), "wire 9") == f"top_up:{TENANT}:wire 9"
    with pytest.raises(BillingError, match=r"'wire 9' .* booked as 9; refusing 10"):
        record_payment(warehouse, TENANT, Decimal("10"), "WIRE 9")
    assert _entries(path, "wire 9") == []  # the legacy row keeps the payment, spelt as it was
    # whatever text might stand in for the missing reference, none matches it
    for reference in ("XXXX", "-", "none"):
        record_payment(warehouse, TENANT, Decimal("3"), reference)
        assert _entries(path, reference.casefold()) == [Decimal("3")]


def test_hardening_a_booking_that_fails_inside_its_transaction_reports_its_own_cause(
    tmp_path: Path,
) -> None:
    """The ledger refuses the write itself (here: an entry id already taken by a row keyed to
    another reference): the caller gets that refusal, naming the key, not an error of the
    clean-up; nothing is booked, and the next payment books as usual."""
    path = build_warehouse(tmp_path / "w.duckdb")
    with duckdb.connect(str(path)) as con:
        con.execute(
            "INSERT INTO billing_ledger VALUES"
            f" ('top_up:{TENANT}:r7', '{TENANT}', 'top_up', 4, NULL, now(), 'another payment')"
        )
    warehouse = Warehouse(path)
    with pytest.raises(duckdb.ConstraintException, match=rf"top_up:{TENANT}:r7"):
        record_payment(warehouse, TENANT, Decimal("5"), "r7")
    assert _entries(path, "r7") == [] and _entries(path, "another payment") == [Decimal("4")]
    assert record_payment(warehouse, TENANT, Decimal("5"), "r8") == f"top_up:{TENANT}:r8"
    assert _entries(path, "r8") == [Decimal("5")]


# --- Mutation testing, issue 47 (second helper): the ledger's other transactions ---


def test_hardening_a_rate_card_rewrite_that_fails_partway_keeps_the_card_in_force(tmp_path: Path) -> None:
    """The rate card is rewritten table by table in one transaction: when a later table cannot
    be written, the caller gets that table's own error and every table keeps the card in force
    (the first one was already emptied and rewritten inside the transaction)."""
    import polars as pl

    from market_pipeline.billing.rate_card import RATE_CARD_TABLES, refresh_rate_card
    from market_pipeline.config import load_config
    from market_pipeline.warehouse import WarehouseError, billing_ledger, open_warehouse

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    card = refresh_rate_card(warehouse, load_config()).tables()

    def snapshot() -> dict[str, list[tuple]]:
        return {t: sorted(warehouse.query(f"SELECT * FROM {t}").rows(), key=repr) for t in RATE_CARD_TABLES}

    before = snapshot()
    assert all(before[t] for t in RATE_CARD_TABLES[:2])
    first, second = RATE_CARD_TABLES[:2]
    broken = {
        first: card[first].head(1),
        second: card[second].with_columns(pl.lit(1).alias("no_such_column")),
    }
    with pytest.raises(WarehouseError, match=rf"append to {second} failed: .*no_such_column"):
        billing_ledger.rewrite_rate_card(warehouse, broken)
    assert snapshot() == before


def test_hardening_a_tenant_in_good_standing_does_not_hide_the_blocked_ones_after_it() -> None:
    """Budget decisions are made for every blocked tenant, wherever it stands among the
    verdicts: an admitted tenant listed first changes nothing."""
    from datetime import datetime, timezone

    from market_pipeline.billing.balances import Account, TenantSpend, evaluate_guards, guard_decisions

    now = datetime(2026, 1, 5, 12, tzinfo=timezone.utc)
    zero = TenantSpend(Decimal(0), Decimal(0), Decimal(0))
    verdicts = evaluate_guards(
        [Account("good", prepaid=False), Account("broke", prepaid=True), Account("late", prepaid=True)],
        {"good": zero, "broke": zero, "late": zero},
        {},
        now,
        300,
        60,
    )
    assert [v.admit_new_tasks for v in verdicts] == [True, False, False]
    frame = guard_decisions(verdicts, {"late": [("job-9", "pool-a")]}, now, shadow=False)
    assert frame.get_column("decision_id").to_list() == [
        "budget:broke:refuse:2026-01-05T12",
        "budget:late:refuse:2026-01-05T12",
        "budget:late:drain:job-9:2026-01-05T12",
    ]


def test_hardening_a_capped_account_with_nothing_spent_yet_may_spend_up_to_its_caps() -> None:
    """A new account (no ledger entry, no rated usage yet) has spent nothing: the next
    interval's cost exactly at its daily and monthly caps is admitted."""
    from datetime import datetime, timezone

    from market_pipeline.billing.balances import Account, evaluate_guards

    capped = Account("new", prepaid=False, hard_cap_daily=Decimal("1"), hard_cap_monthly=Decimal("1"))
    now = datetime(2026, 1, 5, 12, tzinfo=timezone.utc)
    [verdict] = evaluate_guards([capped], {}, {"new": Decimal("12")}, now, 300, 60)
    assert verdict.next_interval_cost == Decimal("1")
    assert verdict.admit_new_tasks and verdict.reasons == () and verdict.drain_after is None


def test_hardening_account_limits_at_the_ledgers_extremes_are_stored_exactly(tmp_path: Path) -> None:
    """Every limit the account check admits is stored as set: the largest amount the ledger
    holds and its smallest unit, in each limit."""
    from market_pipeline.billing.balances import MAX_LEDGER_AMOUNT, Account, accounts, set_account
    from market_pipeline.warehouse import open_warehouse

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    unit = Decimal("0.000000001")
    largest = Account(
        "big",
        prepaid=True,
        credit_limit=MAX_LEDGER_AMOUNT,
        hard_cap_daily=MAX_LEDGER_AMOUNT,
        hard_cap_monthly=MAX_LEDGER_AMOUNT,
    )
    smallest = Account("tiny", prepaid=True, credit_limit=unit, hard_cap_daily=unit, hard_cap_monthly=unit)
    set_account(warehouse, largest)
    set_account(warehouse, smallest)
    assert accounts(warehouse) == [largest, smallest]


@pytest.mark.usefixtures("host_in_kolkata")
def test_hardening_an_account_set_without_a_time_is_stamped_in_utc_on_any_host(tmp_path: Path) -> None:
    """`updated_at` defaults to the UTC instant of the setting, also on a host whose clock is
    set to another zone (+05:30): never local wall time read as UTC."""
    from datetime import datetime, timedelta, timezone

    from market_pipeline.billing.balances import Account, set_account
    from market_pipeline.warehouse import open_warehouse

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    before = datetime.now(timezone.utc)
    set_account(warehouse, Account("alpha", prepaid=True))
    stamp = warehouse.query("SELECT updated_at FROM billing_accounts").item()
    assert before - timedelta(seconds=1) <= stamp <= datetime.now(timezone.utc)


# --- Mutation testing, issue 47 (third helper): spend days and posting stamps on any host ---


def _hourly_invoice_lines(path: Path, rows: list[tuple[str, object, str, str]]) -> None:
    """fct_invoice_lines as the billing rollup leaves them: (tenant, UTC hour, charge
    category, billed cost), hourly grain."""
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE fct_invoice_lines (tenant_id VARCHAR, period_grain VARCHAR,"
            " period_start TIMESTAMPTZ, period_start_utc TIMESTAMP, charge_category VARCHAR,"
            " billed_cost DECIMAL(38, 9))"
        )
        con.executemany(
            "INSERT INTO fct_invoice_lines VALUES (?, 'hour', ?, ?, ?, ?)",
            [
                (t, hour, hour.replace(tzinfo=None), category, Decimal(cost))
                for t, hour, category, cost in rows
            ],
        )


@pytest.mark.usefixtures("host_in_kolkata")
def test_hardening_spend_is_counted_by_the_utc_day_and_month_on_a_host_in_another_time_zone(
    tmp_path: Path,
) -> None:
    """On a host whose clock is set to +05:30, "today" and "this month" of a tenant's spend are
    still the UTC day and month: the last UTC hour of yesterday (already today in Kolkata) is
    yesterday's spend, the last UTC hour of last month is neither, and the first UTC hour of
    today counts, whatever the minute, second and microsecond of the moment asked."""
    import datetime as dt

    from market_pipeline.billing.balances import TenantSpend, tenant_spend

    utc = dt.timezone.utc
    path = build_warehouse(tmp_path / "w.duckdb")
    _hourly_invoice_lines(
        path,
        [
            (TENANT, dt.datetime(2026, 3, 2, 0, tzinfo=utc), "Usage", "3"),  # today's first UTC hour
            (TENANT, dt.datetime(2026, 3, 1, 23, tzinfo=utc), "Usage", "10"),  # yesterday, this month
            (TENANT, dt.datetime(2026, 2, 28, 23, tzinfo=utc), "Usage", "100"),  # last month
        ],
    )
    # asked at any moment of the day, not only on the hour
    spend = tenant_spend(Warehouse(path), dt.datetime(2026, 3, 2, 12, 34, 56, 789012, tzinfo=utc))
    assert spend[TENANT] == TenantSpend(balance=Decimal(5), spent_today=Decimal(3), spent_month=Decimal(13))


@pytest.mark.usefixtures("host_in_kolkata")
def test_hardening_posted_usage_is_stamped_with_the_time_it_was_posted_at(tmp_path: Path) -> None:
    """A posted window's ledger entries carry the time of the posting: the time the caller
    gives, or, given none, the UTC instant of the posting, also on a host whose clock is set
    to +05:30 (never its local wall time read as UTC); a repost restamps them."""
    import datetime as dt

    from market_pipeline.billing.balances import post_invoice_window

    utc = dt.timezone.utc
    start, end = dt.datetime(2026, 3, 2, 10, tzinfo=utc), dt.datetime(2026, 3, 2, 12, tzinfo=utc)
    path = build_warehouse(tmp_path / "w.duckdb")
    _hourly_invoice_lines(
        path, [(TENANT, start, "Usage", "4"), (TENANT, start + dt.timedelta(hours=1), "Credit", "-1")]
    )
    warehouse = Warehouse(path)

    def posted() -> list[tuple]:
        return warehouse.query(
            "SELECT kind, amount, recorded_at FROM billing_ledger WHERE reference = 'fct_invoice_lines'"
            " ORDER BY kind"
        ).rows()

    at = dt.datetime(2026, 3, 2, 12, 5, tzinfo=utc)
    assert post_invoice_window(warehouse, start, end, now=at) == 2
    assert posted() == [("sla_credit", Decimal(1), at), ("usage", Decimal(-4), at)]
    before = dt.datetime.now(utc)
    assert post_invoice_window(warehouse, start, end) == 2
    after = dt.datetime.now(utc)
    stamps = [recorded_at for _, _, recorded_at in posted()]
    assert len(stamps) == 2 and all(before - dt.timedelta(seconds=1) <= s <= after for s in stamps)
