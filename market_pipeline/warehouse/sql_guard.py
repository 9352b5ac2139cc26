"""Read-only SQL for people: one SELECT, no host access, bounded time and memory.

Finance (`market-pipeline sql`) and tenants (`tenant-sql`) type SQL at the warehouse. A
read-only DuckDB connection is not enough: it still runs COPY ... TO (which overwrote the
warehouse file), EXPORT DATABASE, read_text('/etc/shadow'), INSTALL, SET and several
statements at once. So a query must pass two gates:

1. DuckDB's own parser (`duckdb.extract_statements`) must see exactly one statement of type
   SELECT whose first keyword is SELECT, WITH, DESCRIBE (or the read-only spellings SHOW,
   SUMMARIZE, FROM, VALUES, TABLE). PRAGMA is refused even where DuckDB rewrites it to a
   SELECT: it is the settings door.
2. It then runs in a connection that can reach no file: external access off, the local file
   system disabled (DuckDB keeps the attached database file on its allow list, so without
   this `read_blob('<warehouse>')` reads the raw file), extension auto-install/-load off, no
   spill directory, a memory limit, a thread cap, and the configuration locked so the query
   cannot undo any of it. A watchdog thread interrupts it after the time limit (DuckDB has no
   statement timeout), and at most `max_rows` rows are fetched.

The warehouse is ATTACHed read-only into a private in-memory database, so the locked
settings belong to that instance and never to another connection of this process.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from market_pipeline.warehouse.store import LOCK_RETRY_SECONDS  # the store's wait on a writer's lock

# First keywords of the read-only statement forms DuckDB parses as SELECT.
READ_ONLY_KEYWORDS = frozenset(
    {"select", "with", "describe", "desc", "show", "summarize", "from", "values", "table"}
)
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MEMORY_LIMIT_MB = 1024
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_THREADS = 2
DEFAULT_MAX_RESULT_MB = 64
MAX_RESULT_MB = 4096
MAX_TIMEOUT_SECONDS = 3600.0
MAX_MEMORY_LIMIT_MB = 64 * 1024


class SqlRefused(ValueError):
    """The SQL is not one read-only query, or it broke a limit; the message says which."""


@dataclass(frozen=True)
class SqlLimits:
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    max_rows: int = DEFAULT_MAX_ROWS
    threads: int = DEFAULT_THREADS
    max_result_mb: int = DEFAULT_MAX_RESULT_MB

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_seconds) and 0 < self.timeout_seconds <= MAX_TIMEOUT_SECONDS):
            raise SqlRefused(
                f"timeout must be in (0, {MAX_TIMEOUT_SECONDS:g}] seconds, got {self.timeout_seconds}"
            )
        if not 16 <= self.memory_limit_mb <= MAX_MEMORY_LIMIT_MB:
            raise SqlRefused(
                f"memory limit must be in [16, {MAX_MEMORY_LIMIT_MB}] MB, got {self.memory_limit_mb}"
            )
        if not 1 <= self.max_rows <= 100_000_000:
            raise SqlRefused(f"max rows must be in [1, 100000000], got {self.max_rows}")
        if not 1 <= self.max_result_mb <= MAX_RESULT_MB:
            raise SqlRefused(f"result limit must be in [1, {MAX_RESULT_MB}] MB, got {self.max_result_mb}")
        if not 1 <= self.threads <= 64:
            raise SqlRefused(f"threads must be in [1, 64], got {self.threads}")


def check_read_only(sql: str) -> str:
    """`sql` if it is exactly one read-only query; SqlRefused naming the problem otherwise."""
    if "\x00" in sql:
        raise SqlRefused("the query contains a NUL byte")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlRefused(f"the query does not parse: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise SqlRefused(f"exactly one statement is allowed, got {len(statements)}")
    statement = statements[0]
    if statement.type != duckdb.StatementType.SELECT:
        raise SqlRefused(
            f"only a read-only query (SELECT, WITH, DESCRIBE) is allowed, got {statement.type.name}"
        )
    first = _first_keyword(sql)
    if first not in READ_ONLY_KEYWORDS and first != "(":
        raise SqlRefused(f"only a read-only query (SELECT, WITH, DESCRIBE) is allowed, not {first.upper()}")
    return sql


def _first_keyword(sql: str) -> str:
    """The statement's first token (comments skipped), lower case."""
    tokens = duckdb.tokenize(sql)
    if not tokens:
        return ""
    start = tokens[0][0]
    end = tokens[1][0] if len(tokens) > 1 else len(sql)
    word = sql[start:end].strip()
    return "(" if word.startswith("(") else word.split()[0].rstrip(";").lower() if word else ""


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split("\n")[0].split())


def lock_down(con: duckdb.DuckDBPyConnection, limits: SqlLimits) -> None:
    """Cut `con`'s instance off from files, network and its own settings (order matters:
    the temp directory cannot change once external access is off, nothing once locked)."""
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET temp_directory = ''")  # no spill files: over the limit is an error
    con.execute(f"SET memory_limit = '{int(limits.memory_limit_mb)}MB'")
    con.execute(f"SET threads = {int(limits.threads)}")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET lock_configuration = true")


@contextlib.contextmanager
def locked_warehouse(path: Path, limits: SqlLimits) -> Iterator[duckdb.DuckDBPyConnection]:
    """A locked-down connection where the warehouse's tables are the default catalog."""
    if not path.is_file():
        raise SqlRefused(f"warehouse {path} does not exist or is not a file")
    con = duckdb.connect(":memory:")
    try:
        _attach_read_only(con, path)
        lock_down(con, limits)
        yield con
    finally:
        con.close()


def _attach_read_only(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """ATTACH the warehouse read-only, waiting while a writer holds its lock."""
    literal = str(path).replace("'", "''")
    deadline = time.monotonic() + LOCK_RETRY_SECONDS
    delay = 0.05
    while True:
        try:
            con.execute(f"ATTACH '{literal}' AS warehouse (READ_ONLY)")
            con.execute("USE warehouse")
            return
        except duckdb.Error as exc:
            text = str(exc).lower()
            if "lock" not in text and "conflicting" not in text or time.monotonic() > deadline:
                raise SqlRefused(f"cannot open warehouse {path}: {_first_line(exc)}") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def run_limited(
    con: duckdb.DuckDBPyConnection, sql: str, limits: SqlLimits, params: Sequence[object] | None = None
) -> pl.DataFrame:
    """Run one checked query on a locked connection under the time and row limits."""
    check_read_only(sql)
    fired = threading.Event()

    def _interrupt() -> None:
        fired.set()
        con.interrupt()

    watchdog = threading.Timer(limits.timeout_seconds, _interrupt)
    watchdog.daemon = True
    watchdog.start()
    try:
        reader = con.execute(sql, list(params or [])).to_arrow_reader(10_000)
        batches, rows, size = [], 0, 0
        for batch in reader:
            rows += batch.num_rows
            size += batch.nbytes
            if rows > limits.max_rows:
                raise SqlRefused(f"the result has more than {limits.max_rows} rows; add a LIMIT")
            if size > limits.max_result_mb * 1024 * 1024:
                raise SqlRefused(
                    f"the result is larger than the {limits.max_result_mb} MB result limit;"
                    " add a LIMIT or select less"
                )
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=reader.schema)
    except (duckdb.Error, pa.ArrowException) as exc:  # an interrupt can surface from the stream
        if fired.is_set():
            raise SqlRefused(f"the query ran past the {limits.timeout_seconds:g} s time limit") from None
        raise SqlRefused(f"query failed: {_first_line(exc)}") from None
    finally:
        watchdog.cancel()
    return to_frame(table)


def to_frame(table: pa.Table) -> pl.DataFrame:
    """The result as a polars frame; a value polars cannot hold (an interval, an infinite
    timestamp) is SqlRefused naming the column, never a panic."""
    if not table.num_columns:
        return pl.DataFrame()
    try:
        return pl.from_arrow(table)  # type: ignore[return-value]
    except Exception:
        pass
    except BaseException as exc:  # pyo3's PanicException derives from BaseException
        if type(exc).__name__ != "PanicException":
            raise
    for name in table.column_names:
        try:
            pl.from_arrow(table.select([name]))
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            kind = table.schema.field(name).type
            raise SqlRefused(
                f"column {name!r} ({kind}) holds values that cannot be shown; cast it, e.g. {name}::VARCHAR"
            ) from None
    raise SqlRefused("the result cannot be shown")


def query_warehouse(
    path: str, sql: str, limits: SqlLimits, on_start: Callable[[], None] | None = None
) -> pl.DataFrame:
    """One checked query on the warehouse at `path` (what `sql` runs in its bounded child)."""
    with locked_warehouse(Path(path), limits) as con:
        if on_start is not None:
            on_start()
        return run_limited(con, sql, limits)
