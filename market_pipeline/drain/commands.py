"""CLI of the task-drain guardrail: `drain` (one task now) and `drain-plan` (one tick).

`market-pipeline drain --backend local-process --pid PID --warn-seconds W
 --timeout-seconds T --json` drains a process: warning, checkpoint signal (only to a process
that handles it), SIGTERM, SIGKILL after T, to the process and every process it started;
prints one JSON object. Bad arguments (a pid that names no process, PID 1, this command
or an ancestor, a duration that is not a finite number of seconds > 0) get one error line
and exit 2 before anything is written; so does a task another drain is working on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market_pipeline.cli.support import input_error

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

EXIT_OK, EXIT_DRAIN_FAILED, EXIT_USAGE = 0, 1, 2
MAX_DRAIN_SECONDS = 86_400.0  # a CLI drain's waits are bounded by a day
PID_MAX_FALLBACK = 4_194_304  # Linux's largest pid_max, when /proc does not say
DRAIN_SLACK_SECONDS = 10.0  # a CLI drain's hard bound: W + T plus this (see _timing)
DURATION_FLAGS = ("warn_seconds", "timeout_seconds", "checkpoint_timeout_seconds")


def register(sub: argparse._SubParsersAction) -> None:
    drain = sub.add_parser("drain", help="drain one task now (task drainability guardrail)")
    target = drain.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", help="any process on this machine (local-process)")
    target.add_argument("--decision-id", help="execute an approved drain decision")
    drain.add_argument(
        "--backend",
        choices=("simulated", "local-process", "nvml", "dcgm"),
        help="adapter backend (default: the configured one)",
    )
    drain.add_argument("--config", help="TOML config (default: shipped or MARKET_PIPELINE_CONFIG)")
    # Numbers are parsed by _validated (one error line, nothing written), not by argparse.
    drain.add_argument("--warn-seconds", help="notice before SIGTERM")
    drain.add_argument("--timeout-seconds", help="SIGTERM -> SIGKILL grace")
    drain.add_argument(
        "--checkpoint-timeout-seconds", help="wait for a checkpoint acknowledgement (default with --pid: W)"
    )
    drain.add_argument("--tenant-id", default="external", help="tenant of an adopted pid")
    drain.add_argument(
        "--audit",
        choices=("warehouse", "memory"),
        default="warehouse",
        help="where the drain's transitions are recorded",
    )
    drain.add_argument("--json", action="store_true", help="print one JSON object")
    drain.set_defaults(handler=run_drain)

    plan = sub.add_parser("drain-plan", help="plan this tick's task drains (decisions)")
    plan.add_argument("--config", help="TOML config")
    plan.add_argument("--dry-run", action="store_true", help="do not write the decisions")
    plan.add_argument("--scale-down-node", action="append", default=[], help="node to empty")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(handler=run_drain_plan)


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return PID_MAX_FALLBACK


def _seconds(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_DRAIN_SECONDS):
        raise ValueError(
            f"--{flag.replace('_', '-')} must be a finite number of seconds in "
            f"(0, {MAX_DRAIN_SECONDS:.0f}], got {text!r}"
        )
    return value


def _validated(args: argparse.Namespace) -> argparse.Namespace:
    """Every number of the command checked before a config is read or a row written."""
    given = [f for f in DURATION_FLAGS if getattr(args, f) is not None]
    if args.pid is None and given:
        raise ValueError(
            f"--{given[0].replace('_', '-')} applies to --pid drains only; "
            "a decision drains with the configured timing"
        )
    values = {f: _seconds(f, getattr(args, f)) for f in given}
    if args.pid is not None:
        text, top = args.pid.strip(), _pid_max()
        if not (text.isascii() and text.isdigit() and len(text) <= 10 and 1 <= int(text) <= top):
            raise ValueError(f"--pid must be a whole number in [1, {top}], got {args.pid!r}")
        values["pid"] = int(text)
    tenant = args.tenant_id
    if not tenant or len(tenant) > 128 or not tenant.isprintable():
        raise ValueError(f"--tenant-id must be 1-128 printable characters, got {tenant!r}")
    return argparse.Namespace(**{**vars(args), **values})


def _config(args: argparse.Namespace) -> Any:
    from market_pipeline.config import load_config

    config = load_config(getattr(args, "config", None))
    backend = getattr(args, "backend", None)
    if backend and backend != config.adapter.backend:
        config = config.model_copy(update={"adapter": config.adapter.model_copy(update={"backend": backend})})
    return config


def _timing(args: argparse.Namespace, config: MarketPipelineConfig) -> Any:
    from market_pipeline.drain.steps import DrainTiming

    base = DrainTiming.from_config(config)
    if args.pid is None:
        return base
    warn = base.warn_seconds if args.warn_seconds is None else args.warn_seconds
    grace = base.terminate_timeout_seconds if args.timeout_seconds is None else args.timeout_seconds
    checkpoint = warn if args.checkpoint_timeout_seconds is None else args.checkpoint_timeout_seconds
    # The checkpoint runs inside the notice, so W + T bounds the task's part of the drain;
    # the slack covers the drain's own start-up, writes and a rerun after a crash, which
    # must not cut the SIGTERM grace short (past the bound a drain kills at once).
    return replace(
        base,
        warn_seconds=warn,
        checkpoint_timeout_seconds=checkpoint,
        terminate_timeout_seconds=grace,
        max_total_seconds=max(warn, checkpoint) + grace + DRAIN_SLACK_SECONDS,
        poll_seconds=0.05,
    )


@contextlib.contextmanager
def _store(args: argparse.Namespace, config: MarketPipelineConfig) -> Iterator[Any]:
    """The audit store; the warehouse one holds its connection for this short drain."""
    from market_pipeline.drain.protocol import InMemoryAuditStore
    from market_pipeline.drain.store import WarehouseAuditStore
    from market_pipeline.warehouse import open_warehouse

    if args.audit == "memory":
        yield InMemoryAuditStore()
        return
    warehouse = open_warehouse(config.warehouse_path, migrate=True)
    with warehouse.connect() as con:
        yield WarehouseAuditStore(warehouse, connection=con)


def _drain_id(store: Any, lease: Any, task_id: str) -> str:
    """Resume an open drain of this task (the lease's journal names one a killed run left),
    else start the next numbered CLI drain."""
    from market_pipeline.drain.protocol import TERMINAL_STATES

    journal = lease.open_drain_id()
    if journal:
        return journal
    attempt = 1
    while True:
        drain_id = f"cli-{task_id}" + (f"-{attempt}" if attempt > 1 else "")
        history = store.load_states(drain_id)
        if not history or history[-1].state not in TERMINAL_STATES:
            return drain_id
        attempt += 1


def _target(adapter: Any, args: argparse.Namespace, config: MarketPipelineConfig) -> Any:
    """The task of --pid: a running process, or one whose drain a killed run left open
    (its process may have exited since). Any other pid that names no process is an error."""
    from market_pipeline.drain.lease import TaskLease, lease_dir_for
    from market_pipeline.hardware.process_tree import NoSuchProcessError

    try:
        return adapter.adopt_pid(args.pid, tenant_id=args.tenant_id)
    except NoSuchProcessError:
        for task in adapter.tasks_of_pid(args.pid):
            if TaskLease(lease_dir_for(config), task.task_id).open_drain_id():
                return task
        raise


def _drain_pid(args: argparse.Namespace, config: MarketPipelineConfig) -> dict[str, Any]:
    from market_pipeline.drain.executor import DrainExecutor, DrainRequest
    from market_pipeline.drain.lease import TaskLease, lease_dir_for
    from market_pipeline.hardware.local_process.adapter import LocalProcessAdapter
    from market_pipeline.hardware.process_tree import create_time

    if config.adapter.backend != "local-process":
        raise ValueError(f"--pid needs --backend local-process, not {config.adapter.backend!r}")
    timing = _timing(args, config)
    adapter = LocalProcessAdapter.from_config(config)
    task = _target(adapter, args, config)
    created = create_time(args.pid)
    closed = _close_stale_drains(args, config, adapter, timing, task.task_id, created)
    process = (args.pid, created) if created is not None and task.pid == args.pid else None
    # The lease first: a second drain of the task is refused before it opens the warehouse.
    with TaskLease(lease_dir_for(config), task.task_id, process) as lease, _store(args, config) as store:
        executor = DrainExecutor(
            adapter, store, timing, lease=lease, grace_seconds=float(config.billing.grace_seconds)
        )
        report = executor.run(
            DrainRequest(
                drain_id=_drain_id(store, lease, task.task_id), task=task, reasons=("manual: drain --pid",)
            )
        )
    result = {**report.to_json(), "pid": args.pid}
    if closed:
        result["closed_stale_drains"] = closed
    return result


def _close_stale_drains(
    args: argparse.Namespace,
    config: MarketPipelineConfig,
    adapter: Any,
    timing: Any,
    task_id: str,
    created: float | None,
) -> list[dict[str, Any]]:
    """Close the open drains a killed run left on a task whose process has exited and whose
    pid (--pid) now belongs to another process: each is resumed, finds its task gone and
    ends with a reason that says the pid was reused. The new process is never touched:
    every signal is pinned to the old process's create time."""
    from datetime import datetime, timezone

    from market_pipeline.drain.executor import DrainExecutor, DrainRequest
    from market_pipeline.drain.lease import (
        DrainBusy,
        TaskLease,
        lease_dir_for,
        stale_journals,
    )
    from market_pipeline.drain.protocol import DrainProtocolError, task_from_dict

    if created is None:
        return []  # no process has the pid now: _target resumes the open drain itself

    def when(ts: float | None) -> str:
        return "unknown" if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()

    closed = []
    for stale in stale_journals(lease_dir_for(config), args.pid, created):
        if stale.task_id == task_id:
            continue
        note = (
            f"pid_reused: the task's process {stale.pid} (created {when(stale.create_time)}) "
            f"had exited; pid {stale.pid} now belongs to another process (created {when(created)})"
        )
        process = None if stale.create_time is None else (stale.pid, stale.create_time)
        try:
            old_task = task_from_dict(stale.task)
            with (
                TaskLease(lease_dir_for(config), stale.task_id, process) as lease,
                _store(args, config) as store,
            ):
                executor = DrainExecutor(
                    adapter, store, timing, lease=lease, grace_seconds=float(config.billing.grace_seconds)
                )
                report = executor.run(DrainRequest(drain_id=stale.drain_id, task=old_task, note=note))
        except (DrainBusy, DrainProtocolError):
            continue  # another run is closing it, or it is not a drain this command can read
        closed.append(
            {
                "drain_id": report.drain_id,
                "task_id": report.task_id,
                "outcome": report.outcome,
                "final_state": report.final_state.value,
                "reason": report.reason,
            }
        )
    return closed


def _drain_decision(args: argparse.Namespace, config: MarketPipelineConfig) -> dict[str, Any]:
    from market_pipeline.drain.service import execute_decision
    from market_pipeline.hardware import make_adapter
    from market_pipeline.warehouse.profile import configured_warehouse

    # the embedded default's file is refused, not created, when it is missing; the cluster
    # profile's decisions live in its lake and control state, which the configured warehouse opens
    if config.warehouse.backend == "duckdb" and not Path(config.warehouse_path).exists():
        raise ValueError(
            f"no drain decision with id {args.decision_id!r}: no warehouse at {config.warehouse_path}"
        )
    warehouse = configured_warehouse(config, migrate=True)
    report = execute_decision(warehouse, make_adapter(config), config, args.decision_id)
    return report.to_json()


def run_drain(args: argparse.Namespace) -> int:
    from market_pipeline.warehouse import WarehouseError

    try:
        args = _validated(args)
        config = _config(args)
        result = _drain_pid(args, config) if args.pid is not None else _drain_decision(args, config)
    except (ValueError, WarehouseError, OSError) as exc:
        # ConfigError, DrainRefused, DrainBusy, no such / protected pid, ... all name the problem
        return input_error(exc)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['outcome']} in {result['seconds']:.2f}s: {' -> '.join(result['states'])}"
            f" ({result['reason']})"
        )
    return EXIT_OK if result["outcome"] in ("terminated", "killed", "gone") else EXIT_DRAIN_FAILED


def run_drain_plan(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from market_pipeline.drain.limits import DrainLimits
    from market_pipeline.drain.plan import SelectionPolicy, plan_drains
    from market_pipeline.drain.service import gather_planning_inputs, plan_and_record
    from market_pipeline.hardware import make_adapter
    from market_pipeline.warehouse import WarehouseError
    from market_pipeline.warehouse.profile import configured_warehouse

    try:
        config = _config(args)
        # the configured warehouse (the cluster profile's lake and control state too), so that
        # an operator's plan and the loop's spend one disruption budget
        warehouse = configured_warehouse(config, migrate=True)
        adapter = make_adapter(config)
        if args.scale_down_node:
            known = {node.node_id for node in adapter.list_nodes()}
            unknown = sorted(set(args.scale_down_node) - known)
            if unknown:
                raise ValueError(f"--scale-down-node: no node {', '.join(map(repr, unknown))} in the fleet")
        now = datetime.now(timezone.utc)
        if args.dry_run:
            inputs, source = gather_planning_inputs(
                warehouse, adapter, config, wall_now=now, scale_down_nodes=args.scale_down_node
            )
            decisions = plan_drains(
                inputs, SelectionPolicy.from_config(config), DrainLimits.from_config(config)
            )
            written = 0
        else:  # under the plan lock, as the loop's drain_requests plans
            decisions, written, source = plan_and_record(
                warehouse, adapter, config, wall_now=now, scale_down_nodes=args.scale_down_node
            )
    except (ValueError, WarehouseError) as exc:
        return input_error(exc)
    rows = [
        {
            "decision_id": d.decision_id,
            "task_id": d.task.task_id,
            "trigger": d.reason.value,
            "allowed": d.allowed,
            "shadow": d.shadow,
            "reasons": list(d.reasons),
        }
        for d in decisions
    ]
    payload = {"decisions": rows, "written": written, "samples_from": source}
    print(json.dumps(payload) if args.json else json.dumps(payload, indent=1))
    return EXIT_OK
