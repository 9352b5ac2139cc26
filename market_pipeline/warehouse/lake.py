"""The cluster profile's warehouse: a DuckLake, its catalog in PostgreSQL and its data as
Parquet files under a data path (a directory shared by the machines, or an S3-compatible URL).

DuckDB's `INSTALL ducklake` downloads from the extension repository; here the extensions come
from their PyPI wheels (`duckdb-extension-ducklake`, `duckdb-extension-postgres`), built for
one DuckDB version each. Every process installs them from the wheels' files into its own
`extension_directory` (a scratch directory) and loads them; dbt-duckdb's attach is pointed at
the same directory. A process keeps one DuckDB instance with the lake attached (attaching costs
a catalog round trip, ~0.5 s) and hands each caller its own cursor: its own transaction, which
DuckLake checks against every other writer's at commit ("Transaction conflict": retried by the
store).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb

from market_pipeline.warehouse.errors import WarehouseError

# The catalog's alias inside DuckDB: the same name dbt's profile attaches the warehouse under.
CATALOG_ALIAS = "warehouse"
EXTENSION_WHEELS: tuple[tuple[str, str], ...] = (
    ("duckdb_extension_postgres", "postgres"),
    ("duckdb_extension_ducklake", "ducklake"),
)
# dbt's profile (dbt/profiles.yml, target `cluster`) reads these.
CATALOG_ENV = "MARKET_PIPELINE_LAKE_CATALOG"
DATA_PATH_ENV = "MARKET_PIPELINE_LAKE_DATA"
EXTENSION_DIR_ENV = "MARKET_PIPELINE_EXTENSION_DIR"
DBT_TARGET = "cluster"

_LOCK = threading.Lock()
# The threads of this process's DuckDB instance (unset: DuckDB's default, one per core), read
# when the instance is made, like POLARS_MAX_THREADS for Polars: `bench scale` holds each
# worker to one core's worth with it.
THREADS_ENV = "MP_DUCKDB_THREADS"
_INSTANCES: dict[tuple[int, "Lake"], duckdb.DuckDBPyConnection] = {}
_EXTENSION_DIRS: dict[int, Path] = {}


@dataclass(frozen=True)
class Lake:
    """Where a DuckLake lives: its PostgreSQL catalog (libpq string or postgresql:// URL) and
    its data path."""

    catalog: str
    data_path: str

    def attach_sql(self) -> str:
        return (
            f"ATTACH IF NOT EXISTS 'ducklake:postgres:{_quote(self.catalog)}' AS {CATALOG_ALIAS} "
            f"(DATA_PATH '{_quote(self.data_path)}')"
        )

    def describe(self) -> str:
        """The lake for messages: the catalog without its password, and the data path."""
        return f"ducklake catalog {redact(self.catalog)}, data {self.data_path}"

    def dbt_environment(self) -> dict[str, str]:
        """What dbt's `cluster` target reads (the extensions are installed first)."""
        return {
            CATALOG_ENV: self.catalog,
            DATA_PATH_ENV: self.data_path,
            EXTENSION_DIR_ENV: str(extension_directory()),
        }


def redact(catalog: str) -> str:
    """The catalog string with any password replaced by ***."""
    text = re.sub(r"(password\s*=\s*)\S+", r"\1***", catalog, flags=re.IGNORECASE)
    return re.sub(r"(://[^:/@]+:)[^@]+@", r"\1***@", text)


def _quote(text: str) -> str:
    return text.replace("'", "''")


def extension_file(package: str) -> Path:
    """The extension file a wheel ships for this DuckDB version; a clear error otherwise."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WarehouseError(
            f"the ducklake backend needs the Python package {package.replace('_', '-')}=={duckdb.__version__}"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(root.glob(f"extensions/v{duckdb.__version__}/*.duckdb_extension"))
    if not found:
        shipped = sorted(p.name for p in root.glob("extensions/*"))
        raise WarehouseError(
            f"{package.replace('_', '-')} ships no extension for duckdb {duckdb.__version__} "
            f"(it has {', '.join(shipped) or 'none'}); install the wheel of the same version as duckdb"
        )
    return found[0]


def extension_directory() -> Path:
    """This process's extension directory, with the wheels' extensions installed in it."""
    pid = os.getpid()
    with _LOCK:
        if pid not in _EXTENSION_DIRS:
            path = Path(tempfile.mkdtemp(prefix="market-duckdb-ext-"))
            atexit.register(shutil.rmtree, path, True)
            con = duckdb.connect(":memory:", config={"extension_directory": str(path)})
            try:
                for package, _name in EXTENSION_WHEELS:
                    con.execute(f"INSTALL '{_quote(str(extension_file(package)))}'")
            except duckdb.Error as exc:
                raise WarehouseError(f"installing the DuckLake extensions failed: {exc}") from exc
            finally:
                con.close()
            _EXTENSION_DIRS[pid] = path
        return _EXTENSION_DIRS[pid]


def lake_instance(lake: Lake) -> duckdb.DuckDBPyConnection:
    """This process's DuckDB instance with `lake` attached (made on first use)."""
    key = (os.getpid(), lake)
    with _LOCK:
        hit = _INSTANCES.get(key)
    if hit is not None:
        return hit
    ext_dir = extension_directory()
    con = duckdb.connect(":memory:", config={"extension_directory": str(ext_dir)})
    try:
        con.execute("SET TimeZone = 'UTC'")
        if threads := os.environ.get(THREADS_ENV, "").strip():  # a process held to N cores
            con.execute(f"SET threads = {int(threads)}")
        for _package, name in EXTENSION_WHEELS:
            con.execute(f"LOAD {name}")
        if "://" not in lake.data_path:
            Path(lake.data_path).mkdir(parents=True, exist_ok=True)
        con.execute(lake.attach_sql())
    except duckdb.Error as exc:
        con.close()
        raise WarehouseError(f"cannot reach the warehouse's PostgreSQL ({lake.describe()}): {exc}") from exc
    with _LOCK:
        _INSTANCES.setdefault(key, con)
        winner = _INSTANCES[key]
    if winner is not con:
        con.close()
    return winner


def forget_instance(lake: Lake) -> None:
    """Drop this process's instance of `lake` (after its catalog connection broke)."""
    with _LOCK:
        con = _INSTANCES.pop((os.getpid(), lake), None)
    if con is not None:
        try:
            con.close()
        except duckdb.Error:
            pass


def is_transaction_conflict(exc: BaseException) -> bool:
    """DuckLake's optimistic commit lost to a concurrent writer: the transaction may be retried."""
    text = str(exc).lower()
    return "transaction conflict" in text or "conflict" in text and "ducklake" in text
