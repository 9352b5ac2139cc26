"""Where the billing dbt project lives and how plain Python runs it (CLI, bench, tests).

Dagster runs the same project through dagster-dbt (`assets/billing/dbt.py`); this module is for
the callers that have no Dagster context. dbt runs in-process (`dbtRunner`), which saves
the interpreter start and import of a subprocess per invocation.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from market_pipeline.billing.errors import RatingError
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.warehouse.lake import DBT_TARGET as LAKE_DBT_TARGET
from market_pipeline.warehouse.lake import Lake

DBT_PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt"
WAREHOUSE_ENV = "MARKET_PIPELINE_WAREHOUSE"
DBT_FILE_LOG_ENV = "DBT_LOG_LEVEL_FILE"
# dbt unit tests check the SQL of the money macros on fixed inputs: they run in the test
# suite (`dbt test --select test_type:unit`), not in every hourly production build.
UNIT_TESTS_EXCLUDED = ("--exclude-resource-type", "unit_test")
_DBT_LOCK = threading.RLock()  # dbtRunner keeps global state: one invocation at a time
_MANIFESTS: dict[Path, tuple[float, object]] = {}  # project dir -> (sources stamp, Manifest)
_SCRATCH: dict[str, Path] = {}


@dataclass(frozen=True)
class DbtRun:
    args: tuple[str, ...]
    success: bool
    seconds: float
    failures: tuple[str, ...]  # "node: message" of every failed model or test
    node_seconds: tuple[tuple[str, float], ...] = ()  # (node name, execution seconds)


def window_vars(start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """dbt vars that scope the window_table marts to [start, end) (UTC, on the hour)."""
    utc = dt.timezone.utc
    for name, value in (("start", start), ("end", end)):
        if value.tzinfo is None:
            raise RatingError(f"billing window {name} must be timezone-aware, got {value!r}")
        in_utc = value.astimezone(utc)  # a +05:30 hour is not a UTC hour (dbt's check_window_vars)
        if in_utc.minute or in_utc.second or in_utc.microsecond:
            raise RatingError(f"billing window {name} {value.isoformat()} is not on a whole UTC hour")
    if end <= start:
        raise RatingError(f"billing window end {end.isoformat()} is not after start {start.isoformat()}")
    return {"min_date": start.astimezone(utc).isoformat(), "max_date": end.astimezone(utc).isoformat()}


def config_vars(config: MarketPipelineConfig) -> dict[str, str]:
    """dbt vars from the typed config: the idle-cost allocation mode of the tenant capacity
    cost allocation (agg_tenant_capacity_cost)."""
    return {"idle_cost_allocation": config.billing.idle_cost_allocation}


def billing_vars(
    config: MarketPipelineConfig, start: dt.datetime | None = None, end: dt.datetime | None = None
) -> dict[str, str]:
    """The config vars plus, when both bounds are given, the window vars."""
    window = window_vars(start, end) if start is not None and end is not None else {}
    return {**config_vars(config), **window}


@contextlib.contextmanager
def environment_overrides(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _failures(result: object) -> tuple[str, ...]:
    nodes = getattr(getattr(result, "result", None), "results", None) or []
    failed = []
    for node in nodes:
        status = str(getattr(node, "status", "")).lower()
        if status in {"error", "fail", "runtime error"} or status.endswith(("error", "fail")):
            name = getattr(getattr(node, "node", None), "unique_id", "?")
            failed.append(f"{name}: {getattr(node, 'message', '')}")
    if not nodes and getattr(result, "exception", None) is not None:
        failed.append(f"dbt: {result.exception}")
    return tuple(failed)


def _node_seconds(result: object) -> tuple[tuple[str, float], ...]:
    nodes = getattr(getattr(result, "result", None), "results", None) or []
    return tuple(
        (getattr(getattr(n, "node", None), "name", "?"), round(float(getattr(n, "execution_time", 0.0)), 3))
        for n in nodes
    )


def _release_duckdb() -> None:
    """Close dbt-duckdb's process-wide connection: it would hold the warehouse's file lock
    (and a read-write configuration) after the invocation, blocking every other opener."""
    try:
        from dbt.adapters.duckdb.connections import DuckDBConnectionManager as manager
    except ImportError:  # pragma: no cover - dbt-duckdb is a dependency
        return
    with manager._LOCK:
        env = manager._ENV
        manager._ENV = None
        if env is not None:
            with contextlib.suppress(Exception):
                env.close()


def _scratch_target() -> Path:
    """A per-process dbt target dir, so concurrent processes never share run artifacts."""
    if "target" not in _SCRATCH:
        path = Path(tempfile.mkdtemp(prefix="market-billing-dbt-"))
        atexit.register(shutil.rmtree, path, True)
        _SCRATCH["target"] = path
    return _SCRATCH["target"]


def _sources_stamp(project_dir: Path) -> float:
    files = [
        p
        for pattern in ("*.yml", "models/**/*", "macros/**/*", "tests/**/*")
        for p in project_dir.glob(pattern)
        if p.is_file()
    ]
    return max((p.stat().st_mtime for p in files), default=0.0)


def cached_manifest(project_dir: Path = DBT_PROJECT_DIR) -> object:
    """The project's parsed Manifest, parsed once per process (again if a file changed).

    Parsing costs seconds; the manifest does not depend on the warehouse path (the profile
    attaches every warehouse under the catalog name `warehouse`), so one parse serves
    every run of this process.
    """
    stamp = _sources_stamp(project_dir)
    with _DBT_LOCK:
        hit = _MANIFESTS.get(project_dir)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        manifest = parse_manifest(
            _scratch_target() / "parse.duckdb", project_dir, target_path=_scratch_target()
        )
        _MANIFESTS[project_dir] = (stamp, manifest)
        return manifest


def run_dbt(
    command: Sequence[str],
    warehouse_path: str | Path,
    *,
    dbt_vars: Mapping[str, str] | None = None,
    project_dir: Path = DBT_PROJECT_DIR,
    target_path: Path | None = None,
    raise_on_failure: bool = True,
    manifest: object | None = None,
    reuse_manifest: bool = True,
    lake: Lake | None = None,
) -> DbtRun:
    """Run one dbt command (e.g. ["build", "--select", "+focus_export"]) on a warehouse.

    By default the process-wide parsed manifest is reused (`cached_manifest`); pass
    `manifest` to use another, or `reuse_manifest=False` to let dbt parse. With `lake` the
    same project runs on the cluster profile's DuckLake (profile target `cluster`: the lake
    attached under the same catalog name, so the parsed manifest serves both).
    """
    from dbt.cli.main import dbtRunner

    if manifest is None and reuse_manifest:
        manifest = cached_manifest(project_dir)
    if manifest is not None:
        # a run mutates the manifest (compiled nodes, injected ephemeral CTEs): copy it
        manifest = manifest.deepcopy()
    args = [
        *command,
        "--project-dir",
        str(project_dir),
        "--profiles-dir",
        str(project_dir),
        "--quiet",
        "--target-path",
        str(target_path or _scratch_target()),
    ]
    if dbt_vars:
        args += ["--vars", json.dumps(dict(dbt_vars))]
    if lake is not None:
        args += ["--target", LAKE_DBT_TARGET]
    env = {
        WAREHOUSE_ENV: str(Path(warehouse_path).resolve()),
        "DBT_LOG_PATH": str(project_dir / "logs"),
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
        # dbt's debug file log (every event and statement, appended to dbt/logs/dbt.log)
        # cost ~10% of a billing rollup; failures come back in the RatingError either way.
        # DBT_LOG_LEVEL_FILE=debug turns it back on.
        DBT_FILE_LOG_ENV: os.environ.get(DBT_FILE_LOG_ENV, "none"),
        **(lake.dbt_environment() if lake is not None else {}),
    }
    started = time.perf_counter()
    with _DBT_LOCK, environment_overrides(env):
        try:
            result = dbtRunner(manifest=manifest).invoke(args)
        finally:
            _release_duckdb()
    run = DbtRun(
        tuple(args),
        bool(result.success),
        time.perf_counter() - started,
        _failures(result),
        _node_seconds(result),
    )
    if raise_on_failure and not run.success:
        detail = "; ".join(run.failures) or str(getattr(result, "exception", "unknown error"))
        where = lake.describe() if lake is not None else warehouse_path
        raise RatingError(f"dbt {' '.join(command)} failed on {where}: {detail}")
    return run


def parse_manifest(
    warehouse_path: str | Path, project_dir: Path = DBT_PROJECT_DIR, target_path: Path | None = None
) -> object:
    """Parse the project for one warehouse; returns dbt's Manifest for `run_dbt(manifest=)`."""
    from dbt.cli.main import dbtRunner

    args = ["parse", "--project-dir", str(project_dir), "--profiles-dir", str(project_dir), "--quiet"]
    if target_path is not None:
        args += ["--target-path", str(target_path)]
    env = {WAREHOUSE_ENV: str(Path(warehouse_path).resolve()), "DBT_LOG_PATH": str(project_dir / "logs")}
    with _DBT_LOCK, environment_overrides(env):
        try:
            result = dbtRunner().invoke(args)
        finally:
            _release_duckdb()
    if not result.success or result.result is None:
        raise RatingError(f"dbt parse failed for {project_dir}: {result.exception}")
    return result.result


def prepare_manifest(
    project_dir: Path = DBT_PROJECT_DIR, target_dir: Path | None = None, warehouse_path: Path | None = None
) -> Path:
    """`dbt parse` into a scratch dir, then move manifest.json into place atomically.

    Concurrent preparers (tests, Dagster code servers) never see a half-written manifest.
    Parsing for the warehouse the runs will use lets their `dbt` subprocesses reuse the
    partial parse (dbt re-parses fully when the profile's attached path changes).
    """
    target_dir = target_dir or project_dir / "target"
    target_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="parse-", dir=target_dir))
    try:
        path = warehouse_path or target_dir / "parse_placeholder.duckdb"  # parse never opens it
        run_dbt(["parse"], path, project_dir=project_dir, target_path=scratch, reuse_manifest=False)
        manifest = target_dir / "manifest.json"
        os.replace(scratch / "manifest.json", manifest)
        partial = scratch / "partial_parse.msgpack"
        if partial.exists():
            os.replace(partial, target_dir / "partial_parse.msgpack")
        return manifest
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def manifest_is_stale(project_dir: Path = DBT_PROJECT_DIR) -> bool:
    """True when the manifest is missing or older than any model, macro, test or config."""
    manifest = project_dir / "target" / "manifest.json"
    return not manifest.exists() or _sources_stamp(project_dir) > manifest.stat().st_mtime


def ensure_manifest(project_dir: Path = DBT_PROJECT_DIR, warehouse_path: Path | None = None) -> Path:
    """The manifest path, parsing first when it is missing or stale."""
    if manifest_is_stale(project_dir):
        return prepare_manifest(project_dir, warehouse_path=warehouse_path)
    return project_dir / "target" / "manifest.json"
