"""Copy an embedded warehouse (one DuckDB file) into the cluster profile's DuckLake
(`market-pipeline migrate --to cluster`), checking the rows of every table arrived.

The lake is migrated to the current schema first; then, in one transaction, each base table
of the file replaces the lake's table of that name (the migrations' tables and the tables dbt
built). Views are not copied: the migrations make theirs and dbt's next build makes its own.
After the commit, every table's row count in the lake is checked against the file's.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb

from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.errors import WarehouseError
from market_pipeline.warehouse.lake import is_transaction_conflict
from market_pipeline.warehouse.store import Warehouse, rollback

# The target's own record of its schema: migrated, not copied.
NOT_COPIED = frozenset({"schema_migrations"})


@dataclass(frozen=True)
class TableCopy:
    table: str
    source_rows: int
    target_rows: int

    @property
    def ok(self) -> bool:
        return self.source_rows == self.target_rows


def copy_into_lake(source: Path, target: Warehouse) -> list[TableCopy]:
    """Copy every base table of the DuckDB file `source` into the lake `target`; raise
    WarehouseError naming the tables whose row counts differ afterwards."""
    if target.lake is None:
        raise WarehouseError('the copy\'s target is not a DuckLake (set [warehouse] backend = "ducklake")')
    if not source.exists():
        raise WarehouseError(f"warehouse {source} does not exist; nothing to copy")
    target.migrate()
    alias = f"embedded_{uuid.uuid4().hex[:8]}"
    with target.connect() as con:
        try:
            con.execute(f"ATTACH '{_quote(str(source.resolve()))}' AS {alias} (READ_ONLY)")
        except duckdb.Error as exc:
            raise WarehouseError(f"cannot open warehouse {source}: {exc}") from exc
        try:
            counts = _source_counts(con, alias)
            target.retrying(lambda: _copy(con, alias, sorted(counts)))
            result = [TableCopy(table, rows, _count(con, table)) for table, rows in sorted(counts.items())]
        finally:
            con.execute(f"DETACH {alias}")
    wrong = [
        f"{c.table} ({c.source_rows} rows in the file, {c.target_rows} in the lake)"
        for c in result
        if not c.ok
    ]
    if wrong:
        raise WarehouseError(f"copy into {target.location} is incomplete: {'; '.join(wrong)}")
    return result


def _source_counts(con: duckdb.DuckDBPyConnection, alias: str) -> dict[str, int]:
    tables = [
        row[0]
        for row in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'", [alias]
        ).fetchall()
        if row[0] not in NOT_COPIED
    ]
    return {t: int(con.execute(f'SELECT count(*) FROM {alias}.main."{t}"').fetchone()[0]) for t in tables}


def _copy(con: duckdb.DuckDBPyConnection, alias: str, tables: list[str]) -> None:
    existing = {
        row[0]
        for row in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        ).fetchall()
    }
    con.execute("BEGIN")
    table = ""
    try:
        for table in tables:
            if table in existing:
                con.execute(f'DELETE FROM "{table}"')
                con.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM {alias}.main."{table}"')
            else:
                con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM {alias}.main."{table}"')
        table = ""
        con.execute("COMMIT")
    except duckdb.Error as exc:
        rollback(con)
        if is_transaction_conflict(exc):
            raise
        raise WarehouseError(f"copying {table or 'the tables'} into the lake failed: {exc}") from exc


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    return int(con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


def _quote(text: str) -> str:
    return text.replace("'", "''")


def seed_control(source: Path, control: ControlStore) -> dict[str, int]:
    """Copy the embedded file's control state into the control PostgreSQL: every drain step of
    `drain_audit` into the journal (a drain open in the file resumes from there) and every
    executed decision's outcome into `decision_claims` (it is not carried out again). Rows
    already there are kept; returns the rows each table holds for the file's keys afterwards."""
    control.migrate()
    with duckdb.connect(str(source), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        steps = con.execute(
            "SELECT drain_id, seq, state, recorded_at, task_id, node_id, tenant_id, detail FROM drain_audit"
        ).fetchall()
        outcomes = con.execute(
            "SELECT decision_id, executed_at, outcome FROM decisions WHERE executed_at IS NOT NULL"
        ).fetchall()
    rows = []
    for drain, seq, state, at, task, node, tenant, detail in steps:
        data = json.loads(detail) if detail else {}
        rows.append(
            {
                "drain_id": drain, "seq": int(seq), "state": state, "phase": data.get("phase", "only"),
                "recorded_at": at.isoformat(), "task_id": task, "node_id": node, "tenant_id": tenant,
                "detail": data,
            }
        )  # fmt: skip
    return control.seed(rows, [(d, at, o or "") for d, at, o in outcomes])
