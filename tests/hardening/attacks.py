"""The SQL and ledger attack list of issue 23, run and counted.

    python tests/hardening/attacks.py [WORKDIR]     # prints one JSON object of counts

Every attack runs through the real CLI (`sql`, `tenant-sql`, `balance`) against a scratch
warehouse next to a secret file and an empty output folder. Counted: attacks refused,
tracebacks, warehouse checksum changes, files written outside the warehouse, secret or host
content leaked to stdout, and ledger rewrites. test_attacks.py asserts the counts.
"""

from __future__ import annotations

import json
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

from hardening_kit import TENANT, build_warehouse, checksum, clear_refusal, run_cli  # noqa: E402

SECRET = "s3cr3t-issue-23"
HOST_MARKERS = ("root:x:0:0",)  # /etc/passwd's first line

# {w}: the warehouse file, {s}: the secret file, {o}: the output folder
SQL_ATTACKS: tuple[str, ...] = (
    "COPY (SELECT 'x' AS x) TO '{w}' (FORMAT csv)",
    "COPY (SELECT 'x' AS x) TO '{o}/x.csv' (FORMAT csv)",
    "COPY billing_ledger TO '{o}/ledger.parquet' (FORMAT parquet)",
    "EXPORT DATABASE '{o}/export'",
    "SELECT * FROM read_text('{s}')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('{w}')",
    "SELECT * FROM read_blob('{w}.wal')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('{s}')",
    "SELECT * FROM read_json('{s}')",
    "SELECT * FROM read_parquet('{w}')",
    "SELECT * FROM '{s}'",
    "SELECT * FROM glob('/root/*')",
    "SELECT * FROM glob('{o}/../*')",
    "SELECT * FROM sniff_csv('{s}')",
    "SELECT * FROM parquet_metadata('{w}')",
    "SELECT * FROM read_csv('https://example.com/x.csv')",
    "SELECT * FROM read_parquet('s3://bucket/x.parquet')",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET disabled_filesystems",
    "PRAGMA enable_profiling",
    "PRAGMA version",
    "SELECT 1; SELECT 2",
    "SELECT 1; COPY (SELECT 1) TO '{o}/y.csv'",
    "ATTACH '{w}' AS w2",
    "ATTACH '{o}/new.duckdb' AS n",
    "DETACH warehouse",
    "CREATE TABLE t AS SELECT 1",
    "INSERT INTO billing_ledger SELECT * FROM billing_ledger",
    "UPDATE billing_ledger SET amount = 1e6",
    "DELETE FROM billing_ledger",
    "DROP TABLE billing_ledger",
    "CHECKPOINT",
    "CALL pragma_version()",
    "EXPLAIN ANALYZE SELECT 1",
    "USE system",
    "SELECT * FROM query('SELECT * FROM read_text(''{s}'')')",
    "WITH x AS (SELECT * FROM read_text('{s}')) SELECT * FROM x",
    "SELECT (SELECT content FROM read_text('{s}'))",
    "SELECT count(*) FROM range(1000000000000)",
    "SELECT * FROM range(100000000)",
    "SELECT 1 /* ; COPY (SELECT 1) TO '{o}/z.csv' */; DROP TABLE billing_ledger",
    "",
    "SELEC 1",
)
LEDGER_ATTACKS: tuple[tuple[str, ...], ...] = (
    ("--top-up", "99", "--reference", "r6"),  # replay of r6 (booked 10) with another amount
    ("--top-up", "10.5", "--reference", "r6"),
    ("--top-up", "-10", "--reference", "r6"),
    ("--top-up", "nan", "--reference", "r7"),
    ("--top-up", "inf", "--reference", "r7"),
    ("--top-up", "-inf", "--reference", "r7"),
    ("--top-up", "sNaN", "--reference", "r7"),
    ("--top-up", "0", "--reference", "r7"),
    ("--top-up", "-1", "--reference", "r7"),
    ("--top-up", "1e30", "--reference", "r7"),
    ("--top-up", "1e-12", "--reference", "r7"),
    ("--top-up", "ten", "--reference", "r7"),
    ("--top-up", "5"),
    ("--top-up", "5", "--reference", " "),
    ("--credit-limit", "nan"),
    ("--credit-limit", "-5"),
    ("--hard-cap-daily", "inf"),
    ("--top-up", "5", "--reference", "r8", "--credit-limit", "-1"),  # nothing half-written
)


def _ledger(warehouse: Path) -> dict[str, Decimal]:
    import duckdb

    with duckdb.connect(str(warehouse), read_only=True) as con:
        return {
            k: Decimal(v) for k, v in con.execute("SELECT entry_id, amount FROM billing_ledger").fetchall()
        }


def run_attacks(workdir: Path, timeout_seconds: float = 5.0) -> dict[str, object]:
    limits = ("--timeout-seconds", str(timeout_seconds))
    workdir.mkdir(parents=True, exist_ok=True)
    warehouse = build_warehouse(workdir / "warehouse.duckdb")
    secret = workdir / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    out_dir = workdir / "out"
    out_dir.mkdir(exist_ok=True)
    before_files = sorted(p.name for p in workdir.rglob("*"))
    counts = {
        "sql_attacks": 0,
        "ledger_attacks": 0,
        "refused": 0,
        "not_refused": [],
        "tracebacks": 0,
        "checksum_changes": 0,
        "files_written_outside": 0,
        "leaks": 0,
        "ledger_rewrites": 0,
    }
    for template in SQL_ATTACKS:
        query = template.format(w=warehouse, s=secret, o=out_dir)
        for argv in (
            ("sql", query, "--warehouse", str(warehouse), *limits),
            ("tenant-sql", "--tenant", TENANT, query, "--warehouse", str(warehouse), *limits),
        ):
            counts["sql_attacks"] += 1
            before = checksum(warehouse)
            code, out, err = run_cli(*argv)
            counts["tracebacks"] += "Traceback" in err or code == 70
            counts["checksum_changes"] += checksum(warehouse) != before
            counts["leaks"] += SECRET in out or any(m in out for m in HOST_MARKERS)
            if clear_refusal(code, err):
                counts["refused"] += 1
            else:
                counts["not_refused"].append(f"{argv[0]}: {query}")
    # the ledger: book r6 = 10 once, replay it, then the attacks
    code, _, err = run_cli(
        "balance", "--tenant", TENANT, "--top-up", "10", "--reference", "r6", "--warehouse", str(warehouse)
    )
    assert code == 0, err
    booked = _ledger(warehouse)
    replay = run_cli(
        "balance",
        "--tenant",
        TENANT,
        "--top-up",
        "10.000",
        "--reference",
        "r6",
        "--warehouse",
        str(warehouse),
    )
    counts["replay_exit"] = replay[0]
    for extra in (*LEDGER_ATTACKS, *(("--tenant", "nobody", *a) for a in LEDGER_ATTACKS[:1])):
        counts["ledger_attacks"] += 1
        argv = (
            "balance",
            *(() if extra[0] == "--tenant" else ("--tenant", TENANT)),
            *extra,
            "--warehouse",
            str(warehouse),
        )
        before = checksum(warehouse)
        code, out, err = run_cli(*argv)
        counts["tracebacks"] += "Traceback" in err or code == 70
        counts["checksum_changes"] += checksum(warehouse) != before
        if clear_refusal(code, err):
            counts["refused"] += 1
        else:
            counts["not_refused"].append(" ".join(argv[:-2]))
    after = _ledger(warehouse)
    counts["ledger_rewrites"] = sum(after.get(k) != v for k, v in booked.items()) + len(
        set(after) - set(booked)
    )
    counts["files_written_outside"] = len(
        set(p.name for p in workdir.rglob("*")) - set(before_files) - {"warehouse.duckdb.wal"}
    )
    counts["attacks"] = counts["sql_attacks"] + counts["ledger_attacks"]
    return counts


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="attacks-"))
    print(json.dumps(run_attacks(where)))
