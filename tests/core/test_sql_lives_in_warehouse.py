"""SQL lives in the warehouse package: outside `market_pipeline/warehouse/`, no module of the
domain, the Dagster side or the sensors holds a SQL statement, save the offline tooling's listed
below (each with its reason and count, so a new one there is a decision too, not a slip).

A SQL statement here is a string literal (an f-string's text included) that opens with an
upper-case SQL verb (SELECT, INSERT, WITH, BEGIN, SET, ...) and either is the first argument
of a call (`con.execute("COMMIT")`) or reads as a statement (a FROM, INTO, TABLE, SET, ...
after the verb).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("market_pipeline", "assets", "sensors")
WAREHOUSE = "market_pipeline/warehouse/"

_VERB = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|MERGE|WITH|COPY|DROP|ALTER|ATTACH|DETACH|BEGIN|COMMIT|"
    r"ROLLBACK|PRAGMA|CHECKPOINT|INSTALL|LOAD|SET|DESCRIBE|SHOW|TRUNCATE|EXPORT|VACUUM|EXPLAIN|"
    r"SUMMARIZE|USE)(\s|$|;)"
)
_CLAUSE = re.compile(r"\b(FROM|INTO|TABLE|SET|VALUES|WHERE|VIEW|INDEX|TRANSACTION|TO|DATABASE|SCHEMA)\b")

# The offline tooling (market_pipeline/lab/) keeps these, each file with its count.
LAB_ALLOWED: dict[str, tuple[int, str]] = {
    "market_pipeline/lab/billing/bench.py": (
        10,
        "`bench billing` builds its own synthetic warehouse (temporary tenant and pool tables, "
        "generated usage and prices), materialises the hand-written query's totals and compares "
        "them with the dbt rollup's: the benchmark's fixture and its yardstick, not the live loop's reads",
    ),
    "market_pipeline/lab/telemetry/bench.py": (
        4,
        "`bench ingest`'s baseline is a bare DuckDB append (create, insert, checkpoint) timed "
        "against the validated ingest: raw SQL is what it measures",
    ),
    "market_pipeline/lab/scale_bench.py": (
        1,
        "`bench scale` drops the PostgreSQL schema it made for itself on the control store",
    ),
}


def sql_statements(source: str) -> list[tuple[int, str]]:
    """(line, text) of every SQL statement literal in a module's source."""
    tree = ast.parse(source)
    first_args: set[int] = set()
    inside_fstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside_fstrings.update(id(v) for v in node.values)
        if isinstance(node, ast.Call) and node.args:
            first_args.add(id(node.args[0]))
    found = []
    for node in ast.walk(tree):
        if id(node) in inside_fstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        else:
            continue
        verb = _VERB.match(text)
        if verb and (id(node) in first_args or _CLAUSE.search(text, verb.end())):
            found.append((node.lineno, text.strip().splitlines()[0]))
    return sorted(found)


def _statements_by_file() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            statements = sql_statements(path.read_text())
            if statements:
                found[rel] = statements
    return found


def test_the_detector_finds_statements_and_passes_prose_by():
    source = '''
con.execute("BEGIN")
warehouse.query(f"SELECT {cols} FROM {table} WHERE partition_key = ?", [key])
QUERY = """
    WITH t AS (SELECT 1) SELECT * FROM t"""
con.execute(f"COPY ({query}) TO '{target}' ({options})")
help_text = "select a pool; set the price"
name = "SET"
'''
    texts = [text for _, text in sql_statements(source)]
    assert texts == [
        "BEGIN",
        "SELECT {} FROM {} WHERE partition_key = ?",
        "WITH t AS (SELECT 1) SELECT * FROM t",
        "COPY ({}) TO '{}' ({})",
    ]


def test_sql_statements_live_in_the_warehouse_package():
    found = _statements_by_file()
    assert sum(len(s) for f, s in found.items() if f.startswith(WAREHOUSE)) > 100  # the detector sees them
    stray = {
        f"{file}:{line}: {text}"
        for file, statements in found.items()
        if not file.startswith(WAREHOUSE) and file not in LAB_ALLOWED
        for line, text in statements
    }
    assert not stray, "SQL outside market_pipeline/warehouse/ (move it into a typed reader or writer):\n" + (
        "\n".join(sorted(stray))
    )


def test_the_lab_keeps_exactly_its_listed_sql():
    counts = Counter({file: len(s) for file, s in _statements_by_file().items() if file in LAB_ALLOWED})
    assert counts == Counter({file: n for file, (n, _) in LAB_ALLOWED.items()})
