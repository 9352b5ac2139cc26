"""Warehouse access for the service: short read-only connections, one at a time, and a read
cache that holds while the warehouse file is unchanged.

DuckDB lets one process write a file, or any number read it, never both: a read-only
connection held open would lock out the control loop's writer. So every read opens the file
read-only, runs, and closes, and the service never holds a connection between requests.
Opens are serialised by one process-wide lock: DuckDB shares one database instance between
overlapping connections of a process, and an instance that never closes would keep the
shared lock (and a stale view) for as long as requests overlap. While the loop's writer
holds the file, an open waits up to `read_retry_seconds` (then WarehouseBusy, HTTP 503).

An open costs tens of milliseconds, so `query` results are cached under the file's
signature: the size and modification time of the database file and its WAL. Any commit of
the writer changes one of them, so a cached result is never older than the file.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl

from market_pipeline.warehouse import Warehouse, WarehouseError

CACHE_ENTRIES = 1024
T = TypeVar("T")


class WarehouseBusy(WarehouseError):
    """The warehouse stayed locked by its writer past the service's wait."""


def file_signature(path: Path) -> tuple[int, ...]:
    """(size, mtime_ns) of the database file and of its WAL (0, 0 when absent)."""
    out: list[int] = []
    for candidate in (path, path.with_name(path.name + ".wal")):
        try:
            st = os.stat(candidate)
            out += [st.st_size, st.st_mtime_ns]
        except FileNotFoundError:
            out += [0, 0]
    return tuple(out)


@dataclass(frozen=True)
class _Cache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: OrderedDict = field(default_factory=OrderedDict)
    flights: dict = field(default_factory=dict)
    stats: dict = field(default_factory=lambda: {"hits": 0, "misses": 0})


_GATE = threading.Lock()  # one open connection per process at a time (see the module doc)


@dataclass(frozen=True)
class GatedWarehouse(Warehouse):
    """A Warehouse whose connections pass the process's gate and whose reads are cached."""

    cache: _Cache = field(default_factory=_Cache, compare=False, repr=False)

    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        with _GATE:
            try:
                with super().connect(read_only=read_only) as con:
                    yield con
            except WarehouseError as exc:
                if "lock" in str(exc).lower() or "conflicting" in str(exc).lower():
                    raise WarehouseBusy(f"the warehouse is busy (its writer holds it): {exc}") from exc
                raise

    def query(self, sql: str, params: Sequence[object] | None = None) -> pl.DataFrame:
        return self.memo(("query", sql, repr(list(params or []))), lambda: Warehouse.query(self, sql, params))

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()`'s result, reused while the warehouse file is unchanged (a result
        computed only from the warehouse and `key`)."""
        signature = file_signature(self.path)
        hit = self._hit(key, signature)
        if hit is not None:
            return hit[0]
        with self.cache.lock:  # one computation per key at a time: the others wait for it
            flight = self.cache.flights.setdefault(key, threading.Lock())
        with flight:
            with self.cache.lock:
                hit = self.cache.entries.get(key)
                if hit is not None and hit[0] == file_signature(self.path):
                    return hit[1]
            value = compute()
        with self.cache.lock:
            self.cache.flights.pop(key, None)
            self.cache.stats["misses"] += 1
            self.cache.entries[key] = (signature, value)
            self.cache.entries.move_to_end(key)
            while len(self.cache.entries) > CACHE_ENTRIES:
                self.cache.entries.popitem(last=False)
        return value

    def cached(self, key: Hashable) -> tuple[Any] | None:
        """`(result,)` where `memo` holds one for `key` and the warehouse file is unchanged, else
        None. It never computes and never waits on a computation, so an event loop may call it."""
        return self._hit(key, file_signature(self.path))

    def _hit(self, key: Hashable, signature: tuple[int, ...]) -> tuple[Any] | None:
        with self.cache.lock:
            hit = self.cache.entries.get(key)
            if hit is None or hit[0] != signature:
                return None
            self.cache.entries.move_to_end(key)
            self.cache.stats["hits"] += 1
            return (hit[1],)

    def changed_since(self, signature: tuple[int, ...]) -> bool:
        return file_signature(self.path) != signature
