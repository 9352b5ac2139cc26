"""`market-pipeline export focus|invoices|economics`: billing marts to files for finance tools.

Files are partitioned by billing period (the UTC calendar month):
    OUT/billing_period=YYYY-MM/<dataset>.<csv|parquet>
plus OUT/manifest.json (window, format, every file with its rows and sha256) and, for
FOCUS, OUT/focus-metadata.json (FOCUS 1.2 schema metadata: FocusVersion, SchemaId,
DataGenerator, CreationDate, ColumnDefinition), the reference to the schema that FOCUS
asks to be retrievable without reading the data.

Exactly what a window selects: rows whose period lies inside [from, to) (whole UTC hours;
a day row only when its whole day is inside). Reruns are byte-identical: rows are ordered
by their id, DuckDB writes single-threaded, and nothing time-dependent is written. Nothing
is half-written: the export is built in a temporary directory next to OUT and renamed into
place; OUT, when it exists, must be an earlier export (it has a manifest.json) and is
replaced as a whole.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

from market_pipeline.billing.errors import BillingError
from market_pipeline.cli.support import input_error
from market_pipeline.cli.warehouse_options import add_warehouse_argument, warehouse_path
from market_pipeline.config import ConfigError
from market_pipeline.warehouse import Warehouse, WarehouseError, billing_export
from market_pipeline.warehouse.billing_export import DATASETS, Dataset

FOCUS_VERSION = "1.2"
# When this export's FOCUS schema was defined; the SchemaId (a hash of the column
# definitions) changes with any column change, and so must this date (tests pin both).
FOCUS_SCHEMA_CREATED = "2026-12-01T00:00:00Z"
DATA_GENERATOR = "market-pipeline"
MANIFEST = "manifest.json"
FORMATS = ("csv", "parquet")
UTC = dt.timezone.utc


class ExportError(BillingError):
    """The export cannot be written; the message names the window, path or table."""


@dataclass(frozen=True)
class ExportResult:
    what: str
    out: Path
    files: tuple[dict, ...]

    @property
    def rows(self) -> int:
        return sum(f["rows"] for f in self.files)


def parse_window(start: str, end: str) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) from ISO texts (naive = UTC): whole UTC hours, end after start."""
    bounds = []
    for name, text in (("--from", start), ("--to", end)):
        try:
            value = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ExportError(f"{name} {text!r} is not an ISO time (e.g. 2026-03-01T00:00:00Z)") from None
        value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
        if value.minute or value.second or value.microsecond:
            raise ExportError(f"{name} {text!r} is not on a whole UTC hour (billing rows are hourly)")
        bounds.append(value)
    if bounds[1] <= bounds[0]:
        raise ExportError(f"empty window: --to {end} is not after --from {start}")
    return bounds[0], bounds[1]


def _naive(value: dt.datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def focus_metadata(con: duckdb.DuckDBPyConnection) -> dict:
    """FOCUS 1.2 schema metadata of focus_export (metadata/schema in the specification)."""
    definitions = []
    for name, kind in billing_export.column_types(con, "focus_export"):
        kind = kind.upper()
        entry: dict = {"ColumnName": name}
        if kind.startswith("DECIMAL"):
            precision, scale = kind[len("DECIMAL(") : -1].split(",")
            entry |= {"DataType": "DECIMAL", "NumericPrecision": int(precision), "NumberScale": int(scale)}
        elif kind.startswith("TIMESTAMP"):
            entry["DataType"] = "DATETIME"
        elif kind == "JSON":
            entry["DataType"] = "JSON"
            if name == "Tags":
                entry["ProviderTagPrefixes"] = ["market-pipeline/"]
        elif kind in ("BIGINT", "INTEGER"):
            entry["DataType"] = "INTEGER"
        else:
            entry |= {"DataType": "STRING", "StringEncoding": "UTF-8"}
        definitions.append(entry)
    schema_id = hashlib.sha256(json.dumps(definitions, sort_keys=True).encode()).hexdigest()[:32]
    return {
        "SchemaId": schema_id,
        "FocusVersion": FOCUS_VERSION,
        "CreationDate": FOCUS_SCHEMA_CREATED,
        "DataGenerator": DATA_GENERATOR,
        "ColumnDefinition": definitions,
    }


def _write_dataset(
    con: duckdb.DuckDBPyConnection, dataset: Dataset, lo: str, hi: str, fmt: str, staging: Path
) -> list[dict]:
    try:
        periods = billing_export.window_periods(con, dataset, lo, hi)
    except duckdb.CatalogException:
        raise ExportError(
            f"table {dataset.table} is not in the warehouse: run `market-pipeline billing-rollup` first"
        ) from None
    select = billing_export.select_list(con, dataset.table, fmt)
    files = []
    for period in periods:
        folder = staging / f"billing_period={period}"
        folder.mkdir(exist_ok=True)
        target = folder / f"{dataset.name}.{fmt}"
        rows = billing_export.copy_period(con, dataset, select, lo, hi, period, fmt, target)
        files.append(
            {
                "billing_period": period,
                "path": str(target.relative_to(staging)),
                "rows": int(rows),
                "sha256": _sha256(target),
            }
        )
    return files


def _claim_target(out: Path) -> Path:
    """The directory the export replaces; refuses anything that is not an earlier export."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a directory")
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ExportError(
            f"--out {out} is a non-empty directory that is not an export (no {MANIFEST}); "
            "choose a new or an earlier export's directory"
        )
    parent = out.resolve().parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise ExportError(f"--out {out}: {parent} {problem}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"--out {out}: directory {parent} is not writable")
    return parent


def _swap_into_place(staging: Path, out: Path) -> None:
    """Rename the finished export over `out` (the old one is moved aside first, then removed)."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.resolve().parent))
        os.replace(out, old / "export")
    try:
        os.replace(staging, out)
    except OSError:
        if old is not None:
            os.replace(old / "export", out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def export(
    warehouse: Warehouse, what: str, start: dt.datetime, end: dt.datetime, fmt: str, out: Path
) -> ExportResult:
    """Write dataset `what` (focus, invoices, economics) for [start, end) under `out`."""
    if what not in DATASETS:
        raise ExportError(f"unknown export {what!r}; choose one of {', '.join(DATASETS)}")
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose csv or parquet")
    parent = _claim_target(out)
    lo, hi = _naive(start), _naive(end)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as exc:
        raise ExportError(f"--out {out}: cannot write in {parent}: {exc.strerror}") from None
    try:
        with billing_export.export_connection(warehouse) as con:
            files = [
                f for dataset in DATASETS[what] for f in _write_dataset(con, dataset, lo, hi, fmt, staging)
            ]
            manifest = {
                "export": what,
                "format": fmt,
                "from": start.isoformat(),
                "to": end.isoformat(),
                "files": sorted(files, key=lambda f: f["path"]),
            }
            if what == "focus":
                metadata = focus_metadata(con)
                (staging / "focus-metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
                manifest |= {"focus_version": FOCUS_VERSION, "schema_id": metadata["SchemaId"]}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _swap_into_place(staging, out)
    except duckdb.Error as exc:
        raise ExportError(f"export {what} to {out} failed: {exc}") from None
    except OSError as exc:
        raise ExportError(f"export {what} to {out} failed: {exc.strerror}: {exc.filename}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(what, out, tuple(manifest["files"]))


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export", help="billing marts to files per billing period (FOCUS, invoices, economics)"
    )
    parser.add_argument("what", choices=tuple(DATASETS))
    parser.add_argument("--from", dest="start", required=True, help="ISO hour, window start (UTC if naive)")
    parser.add_argument("--to", dest="end", required=True, help="ISO hour, window end (exclusive)")
    parser.add_argument("--format", choices=FORMATS, default="csv")
    parser.add_argument(
        "--out", required=True, help="export directory (created, or an earlier export replaced)"
    )
    add_warehouse_argument(parser)
    parser.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    try:
        start, end = parse_window(args.start, args.end)
        path = warehouse_path(args.warehouse)
        result = export(Warehouse(path), args.what, start, end, args.format, Path(args.out))
    except (BillingError, ConfigError, WarehouseError) as exc:
        return input_error(exc)
    print(
        json.dumps(
            {"export": result.what, "out": str(result.out), "files": len(result.files), "rows": result.rows}
        )
    )
    return 0
