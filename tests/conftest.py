"""Shared fixtures: an isolated project home per test session, and the traces folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest keeps each test module it rewrites (for its assert messages) as bytecode under
# __pycache__ and reads it back on the next run; where the environment sets
# PYTHONDONTWRITEBYTECODE (this machine's shells do) nothing was kept, and both xdist
# workers rewrote the ~290 test modules again on every run (collecting took 24-26 s, 13 s
# with the bytecode kept). The suite's own processes write bytecode (the __pycache__
# folders are git-ignored); the processes they start still follow the environment.
sys.dont_write_bytecode = False

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

# The Dagster partitions begin where the fleet's history begins (a week before today for a
# new twin); the suite's fixtures materialise fixed hours from 2024 and 2026, so it pins the
# start before the definitions load. The demo and soak tests run without the pin.
os.environ.setdefault("MARKET_PIPELINE_HISTORY_START", "2024-01-01T00:00:00Z")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public traces; tests that need them skip when they are absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def run_tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that its xdist workers share (each worker's base temp folder is
    one of its subfolders), for what one worker builds and the others reuse under a file
    lock; in a run without workers, the run's own base temp folder (its parent holds earlier
    runs' folders, whose builds must not be reused)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _sigterm_reaches_children() -> None:
    """Children this suite spawns must die on SIGTERM, however the suite was launched.

    A shell runs a background job with SIGINT ignored, and each in-process Dagster run ends
    by pointing SIGTERM at SIGINT's handler (`dagster._utils.interrupts`). The suite would
    then ignore SIGTERM, every child it spawns would inherit that, and the drain tests that
    SIGTERM a plain `sleep` would fail under `make test &` but pass in a terminal.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _no_config_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's MP__* / MARKET_PIPELINE_CONFIG must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("MP__") or name == "MARKET_PIPELINE_CONFIG":
            monkeypatch.delenv(name, raising=False)


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker leads a process group of its own. A drain of a root that leads
    neither its group nor its session takes as the task's every orphan born during the
    drain in that group and session (`hardware.process_tree.Newcomers`): with the workers in
    one group, a drain test on one worker took and killed the orphan that a process-tree test
    on another had just double-forked (`assert [6104] == [6104, 6106]`, reproduced with two
    suites side by side in one group). Tests in one worker run one at a time."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        with contextlib.suppress(OSError):  # already a group leader
            os.setpgid(0, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the tests are handed out in: under mutmut quickest first, under xdist the
    modules of the slow tests first; a plain run keeps the collected order."""
    if "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", ""):
        _quickest_first(items)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        _slow_modules_first(items)


def _quickest_first(items: list[pytest.Item]) -> None:
    """Under mutmut (`make mutate`), quickest tests first. Each mutant runs the tests that
    reach its function, with `-x`, in no fixed order; a mutant of the config's validation
    reaches some fifty tests across nine files, and one slow test first cost 30-40 s a mutant
    on the shared machine. Ordered by the time mutmut recorded for each (its stats file in
    the mutants/ copy the tests run from), a killed mutant stops at the first quick test that
    fails."""
    import json

    try:
        durations = json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """The xdist workers (`--dist loadscope --no-loadscope-reorder`, pyproject's addopts) take
    whole modules, in the order of their first test here: every module holding a test marked
    `slow` (a minute or two each: the demo, the whole-tick bench, the live Slurm loop, the
    billing builds on the lake) goes first, the rest in the collected order. Handed out in
    file order and in chunks (`--dist load`), a long test that came up late could leave the
    other worker idle for up to about a minute; started first, the long modules end while
    the many short ones still balance the workers. Every worker sorts alike (a stable sort of the same
    collection), as xdist requires; a module's own tests keep their order."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


# Property tests draw the same examples on every run: CI must not turn red by chance.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("repeatable", derandomize=True, deadline=None)
_hypothesis_settings.load_profile("repeatable")


@contextlib.contextmanager
def fresh_postgres_database(prefix: str, template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database on 127.0.0.1:5432 (its libpq string), dropped afterwards; a
    copy of the database `template` (its name) when one is given. Skips the test when
    PostgreSQL is not running there."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = psycopg2.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", connect_timeout=3)
    except psycopg2.OperationalError:
        pytest.skip("PostgreSQL is not running on 127.0.0.1:5432")
    admin.autocommit = True
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield f"host=127.0.0.1 port=5432 user=postgres dbname={name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture(scope="session")
def _migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty warehouse file with every migration applied, made once per test process."""
    from market_pipeline.warehouse import open_warehouse

    path = tmp_path_factory.mktemp("migrated_template") / "w.duckdb"
    open_warehouse(path)
    if path.with_name(path.name + ".wal").exists():  # the file alone must hold the schema
        raise RuntimeError(f"{path} was left with a WAL beside it")
    return path


@pytest.fixture()
def migrated_warehouse(_migrated_template: Path, tmp_path: Path) -> object:
    """An empty, migrated warehouse of this test's own at tmp_path/w.duckdb: a copy of the
    session's template, the file `open_warehouse` leaves (migrating one per test cost more
    than many of the tests). Tests of the migrations themselves call `open_warehouse`."""
    from market_pipeline.warehouse import Warehouse

    path = tmp_path / "w.duckdb"
    shutil.copyfile(_migrated_template, path)
    return Warehouse(path)


@pytest.fixture()
def lake(tmp_path: Path) -> Iterator[object]:
    """An empty DuckLake of this test's own (the cluster profile's warehouse): its catalog a
    fresh PostgreSQL database on 127.0.0.1:5432, dropped afterwards, its data under tmp_path.
    Skips when PostgreSQL is down or the DuckLake extension wheels are not installed."""
    from market_pipeline.warehouse import Lake, WarehouseError
    from market_pipeline.warehouse.lake import extension_directory, forget_instance

    try:
        extension_directory()
    except WarehouseError as exc:
        pytest.skip(str(exc))
    with fresh_postgres_database("mp_lake_test_") as catalog:
        made = Lake(catalog, f"{tmp_path}/lake/")
        try:
            yield made
        finally:
            forget_instance(made)


@pytest.fixture(scope="session")
def _migrated_lake_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The name of a PostgreSQL database holding the catalog of a DuckLake with every migration
    applied, made once per test process (migrating a lake takes seconds: one catalog
    transaction per statement); dropped at the end. Its data path holds no file (the rows
    the migrations write are inlined in the catalog)."""
    from market_pipeline.warehouse import Lake, WarehouseError, open_warehouse
    from market_pipeline.warehouse.lake import extension_directory, forget_instance

    try:
        extension_directory()
    except WarehouseError as exc:
        pytest.skip(str(exc))
    data_path = tmp_path_factory.mktemp("lake_template")
    with fresh_postgres_database("mp_lake_template_") as catalog:
        template = Lake(catalog, f"{data_path}/lake/")
        open_warehouse(data_path / "unused.duckdb", lake=template)
        forget_instance(template)  # no connection may stay open on a template
        if any(path.is_file() for path in data_path.rglob("*")):
            raise RuntimeError(f"the migrated lake wrote data files under {data_path}")
        yield catalog.rsplit("dbname=", 1)[1]


@pytest.fixture()
def migrated_lake(_migrated_lake_template: str, tmp_path: Path) -> Iterator[object]:
    """A DuckLake of this test's own with every migration applied, as `lake` is after
    `open_warehouse`: its catalog a copy of the session's template (PostgreSQL's CREATE DATABASE
    ... TEMPLATE), pointed at a data path under tmp_path. Tests of the lake's migrations
    themselves take `lake`."""
    import psycopg2

    from market_pipeline.warehouse import Lake
    from market_pipeline.warehouse.lake import forget_instance

    with fresh_postgres_database("mp_lake_test_", template=_migrated_lake_template) as catalog:
        data_path = f"{tmp_path}/lake/"
        with psycopg2.connect(catalog) as con, con.cursor() as cursor:  # commits on leaving
            cursor.execute("UPDATE ducklake_metadata SET value = %s WHERE key = 'data_path'", [data_path])
            if cursor.rowcount != 1:
                raise RuntimeError("the lake template's catalog records no data_path")
        con.close()
        made = Lake(catalog, data_path)
        try:
            yield made
        finally:
            forget_instance(made)


@pytest.fixture()
def control_url() -> Iterator[str]:
    """A fresh PostgreSQL database on 127.0.0.1:5432 for the cluster profile's control state,
    dropped afterwards; skips when PostgreSQL is not running there."""
    with fresh_postgres_database("mp_control_test_") as url:
        yield url


@pytest.fixture
def host_in_kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is UTC+05:30 for the test (a host not set to UTC)."""
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
