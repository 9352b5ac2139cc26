"""`market-pipeline cluster up|down|status|workload --backend slurm` (`bench slurm`: `lab.slurm`).

The local test cluster lives under `--home` (default: two levels above `adapter.slurm_conf`,
i.e. `var/slurm`), so that `MP__ADAPTER__BACKEND=slurm` finds the cluster `cluster up` made.
A Slurm that cannot be reached is one `error:` line naming slurmctld or munge, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from market_pipeline.cli.support import input_error
from market_pipeline.config import ConfigError, load_config

RUNTIME_ERROR = 1


def register(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="a local test cluster of a cluster manager (slurm)")
    actions = cluster.add_subparsers(dest="cluster_action", required=True)
    for name, help_text in (
        ("up", "start munge, slurmctld and one slurmd per node under --home"),
        ("down", "stop every daemon (and leftover job) of the cluster under --home"),
        ("status", "nodes, GPUs, running tasks and nodes in states the adapter does not act on"),
        ("workload", "submit openb-shaped jobs (some checkpointable) to the cluster"),
    ):
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("--backend", choices=["slurm"], default="slurm")
        parser.add_argument("--home", type=Path, default=None, help="the cluster's directory")
        parser.add_argument("--json", action="store_true")
        if name == "up":
            parser.add_argument("--nodes", type=int, default=4, help="nodes, half of each GPU type (>= 2)")
            parser.add_argument("--gpus-per-node", type=int, default=8)
            parser.add_argument(
                "--accounts",
                action="store_true",
                help="also a private MariaDB and slurmdbd, one Slurm account per configured tenant",
            )
        if name == "workload":
            parser.add_argument("--jobs", type=int, default=20)
            parser.add_argument(
                "--time-scale", type=float, default=200.0, help="trace seconds per job second"
            )
            parser.add_argument("--max-seconds", type=int, default=120)
            parser.add_argument("--seed", type=int, default=7)
        parser.set_defaults(handler=run_cluster)


def _home(args: argparse.Namespace, config) -> Path:  # noqa: ANN001 - MarketPipelineConfig
    if args.home is not None:
        return args.home.resolve()
    return config.resolve_path(config.adapter.slurm_conf).parent.parent


def run_cluster(args: argparse.Namespace) -> int:
    from market_pipeline.hardware.slurm.adapter import SlurmAdapter
    from market_pipeline.hardware.slurm.client import SlurmError
    from market_pipeline.hardware.slurm.cluster import ClusterError, ClusterSpec, LocalCluster
    from market_pipeline.hardware.slurm.workload import cluster_kinds, submit, workload_specs

    try:
        config = load_config()
    except ConfigError as exc:
        return input_error(exc)
    nodes = getattr(args, "nodes", 4)
    gpus = getattr(args, "gpus_per_node", 8)
    if not (2 <= nodes <= 64 and 1 <= gpus <= 16):
        return input_error("need 2 <= --nodes <= 64 and 1 <= --gpus-per-node <= 16")
    accounts = tuple(t.id for t in config.tenants) if getattr(args, "accounts", False) else ()
    spec = ClusterSpec.two_types(nodes, gpus, min_job_age_seconds=120)
    cluster = LocalCluster(_home(args, config), replace(spec, accounts=accounts))
    try:
        if args.cluster_action == "up":
            cluster.up(timeout_seconds=90 if accounts else 30)
            result: dict = {
                "home": str(cluster.home),
                "slurm_conf": str(cluster.conf),
                "nodes": nodes,
                "accounts": list(accounts),
            }
        elif args.cluster_action == "down":
            result = {"home": str(cluster.home), "stopped": cluster.down()}
        elif args.cluster_action == "status":
            adapter = SlurmAdapter.for_cluster(cluster, config)
            result = {
                "nodes": [n.__dict__ | {"state": n.state.value} for n in adapter.list_nodes()],
                "not_acted_on": adapter.node_conditions(),
                "tasks": [
                    {
                        "task_id": t.task_id,
                        "tenant": t.tenant_id,
                        "node": t.node_id,
                        "gpus": list(t.gpu_uuids),
                        "class": t.resource_class.value,
                        "started_at": t.started_at.isoformat(),
                    }
                    for t in adapter.list_tasks()
                ],
            }
        else:
            if not (1 <= args.jobs <= 10_000 and args.time_scale > 0 and 1 <= args.max_seconds <= 86_400):
                return input_error("need 1 <= --jobs <= 10000, --time-scale > 0, 1 <= --max-seconds <= 86400")
            adapter = SlurmAdapter.for_cluster(cluster, config)
            kinds = cluster_kinds([(n.gpu_type, n.gpus) for n in adapter.slurm_nodes()], adapter.namer)
            specs = workload_specs(
                config.tenants,
                kinds,
                args.jobs,
                seed=args.seed,
                time_scale=args.time_scale,
                max_seconds=args.max_seconds,
            )
            result = {"submitted": submit(cluster.client(), specs, cluster.home / "jobs")}
    except (ClusterError, SlurmError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return RUNTIME_ERROR
    print(json.dumps(result, indent=2, default=str) if args.json else _plain(result))
    return 0


def _plain(result: dict) -> str:
    return "\n".join(f"{k}: {v}" for k, v in result.items())
