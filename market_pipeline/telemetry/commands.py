"""`market-pipeline telemetry ...` (`bench ingest|telemetry-checks` are the lab's: `lab.telemetry`)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from market_pipeline.cli.warehouse_options import add_warehouse_argument, warehouse_path
from market_pipeline.config import ConfigError, load_config
from market_pipeline.telemetry.partitions import PartitionKeyError, partition_window
from market_pipeline.telemetry.schema import TelemetryInputError
from market_pipeline.warehouse import WarehouseError


def register(sub: argparse._SubParsersAction) -> None:
    telemetry = sub.add_parser("telemetry", help="telemetry ingest, checks and adapter probes")
    tsub = telemetry.add_subparsers(dest="telemetry_command", required=True)

    ingest = tsub.add_parser("ingest", help="validate a CSV/Parquet/dcgm file into the warehouse")
    ingest.add_argument(
        "--file",
        required=True,
        help="CSV or Parquet in the canonical sample schema, or a dcgm-exporter text exposition (.txt/.prom)",
    )
    add_warehouse_argument(ingest)
    ingest.add_argument(
        "--source",
        help="source name (default: file:<absolute path>); "
        "re-ingesting a source replaces what it wrote to those partitions",
    )
    ingest.add_argument(
        "--partition",
        help="hourly partition key (YYYY-MM-DD-HH:00): all rows "
        "belong to it, rows outside it are quarantined",
    )
    ingest.add_argument("--json", action="store_true", help="print one JSON object")
    ingest.set_defaults(handler=run_ingest)

    check = tsub.add_parser("check", help="run the data-quality checks of one partition")
    check.add_argument("--partition", required=True, help="hourly partition key")
    add_warehouse_argument(check)
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=run_check)

    probe = tsub.add_parser("probe", help="what a hardware backend sees (nodes, GPUs, samples)")
    probe.add_argument("--backend", choices=("nvml", "dcgm", "configured"), default="configured")
    probe.add_argument("--endpoint", help="dcgm: URL or file (default: adapter.dcgm_endpoint)")
    probe.add_argument("--json", action="store_true", help="print one JSON object")
    probe.set_defaults(handler=run_probe)


def _emit(payload: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload, default=str))
    else:
        for key, value in payload.items():
            print(f"{key}: {json.dumps(value, default=str)}")


def _fail(message: str, as_json: bool, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message}))
    return code


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def run_ingest(args: argparse.Namespace) -> int:
    from market_pipeline.telemetry.ingest import ingest_samples, known_gpu_uuids
    from market_pipeline.telemetry.rules import ValidationPolicy
    from market_pipeline.telemetry.schema import read_sample_file
    from market_pipeline.warehouse import open_warehouse

    try:
        config = load_config()
        window = partition_window(args.partition) if args.partition else None
        path = Path(args.file)
        frame = read_sample_file(path)
        warehouse = open_warehouse(warehouse_path(args.warehouse, config))
        policy = ValidationPolicy.from_config(
            config.telemetry,
            now=datetime.now(timezone.utc),
            window=window,
            known_gpu_uuids=known_gpu_uuids(warehouse),
        )
        mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        report = ingest_samples(
            warehouse,
            frame,
            source=args.source or f"file:{path.resolve()}",
            policy=policy,
            fallback_time=mtime,
            where=str(path),
        )
    except (TelemetryInputError, PartitionKeyError) as exc:
        return _fail(str(exc), args.json)
    except (ConfigError, WarehouseError, OSError) as exc:
        return _fail(str(exc), args.json, code=1)
    if report.ignored_columns:
        _log(f"ignored columns not in the sample schema: {', '.join(report.ignored_columns)}")
    _log(
        f"ingest {report.ingest_id}: partitions {', '.join(report.partitions) or '-'} "
        f"in {report.seconds:.2f}s"
    )
    _emit(report.summary(), args.json)
    return 0


def run_check(args: argparse.Namespace) -> int:
    from market_pipeline.telemetry.checks import evaluate_partition
    from market_pipeline.warehouse import Warehouse

    try:
        config = load_config()
        partition_window(args.partition)
        warehouse = Warehouse(warehouse_path(args.warehouse, config))
        result = evaluate_partition(warehouse, args.partition, config.telemetry, datetime.now(timezone.utc))
    except PartitionKeyError as exc:
        return _fail(str(exc), args.json)
    except (ConfigError, WarehouseError) as exc:
        return _fail(str(exc), args.json, code=1)
    _emit(result.summary(), args.json)
    return 0 if result.passed else 3


def run_probe(args: argparse.Namespace) -> int:
    try:
        config = load_config()
    except ConfigError as exc:
        return _fail(str(exc), args.json, code=1)
    backend = config.adapter.backend if args.backend == "configured" else args.backend
    if backend == "nvml":
        from market_pipeline.hardware.nvml.adapter import NvmlAdapter

        adapter = NvmlAdapter.from_config(config)
        try:
            return _emit_probe(adapter.snapshot(), args.json)
        finally:
            adapter.close()
    if backend == "dcgm":
        from market_pipeline.hardware.dcgm.adapter import DcgmAdapter, DcgmSourceError

        try:
            adapter = (
                DcgmAdapter([s.strip() for s in args.endpoint.split(",")])
                if args.endpoint
                else DcgmAdapter.from_config(config)
            )
        except DcgmSourceError as exc:
            return _fail(str(exc), args.json)
        try:
            return _emit_probe(_dcgm_snapshot(adapter), args.json)
        except (DcgmSourceError, ValueError) as exc:  # the probe passed, the read then failed
            return _fail(" ".join(str(exc).split()), args.json, code=1)
    return _fail(f"probe supports the nvml and dcgm backends, not {backend!r}", args.json)


def _emit_probe(snapshot: dict[str, object], as_json: bool) -> int:
    """Print what the backend sees; a backend that cannot be read is also one `error:` line on
    stderr and exit 1 (what it saw, its status and detail included, still goes to stdout)."""
    _emit(snapshot, as_json)
    if snapshot.get("status") == "ok":
        return 0
    detail = " ".join(str(snapshot.get("detail") or "").split())
    print(
        f"error: the {snapshot.get('backend')} backend is not readable: {snapshot.get('status')}: {detail}",
        file=sys.stderr,
    )
    return 1


def _dcgm_snapshot(adapter) -> dict[str, object]:
    from market_pipeline.hardware.dcgm.exposition import scrape_samples
    from market_pipeline.hardware.nvml.snapshot import json_ready

    outcome = adapter.probe()
    snapshot: dict[str, object] = {
        "backend": "dcgm",
        "sources": list(adapter.sources),
        "status": outcome.status.value,
        "detail": outcome.detail,
    }
    if outcome.ok:
        rows = [row for scrape in adapter.scrape() for row in scrape_samples(scrape).to_dicts()]
        snapshot.update(
            nodes=json_ready(adapter.list_nodes()),
            gpus=json_ready(adapter.list_gpus()),
            tasks=json_ready(adapter.list_tasks()),
            samples=json_ready(rows),
        )
    return snapshot
