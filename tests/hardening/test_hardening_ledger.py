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
try:
    record_payment(Warehouse(Path(sys.argv[1])), sys.argv[2], Decimal(sys.argv[3]), "wire-c")
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
