"""`market-pipeline placement replay` and `market-pipeline bench placement`: the FGD
saturation experiment on a node list and a pod list (default: openb under ../shared)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from market_pipeline.fleet.catalog import FleetSourceError
from market_pipeline.fleet.shapes import WorkloadError
from market_pipeline.lab.placement.saturation import compare_policies, load_openb_experiment
from market_pipeline.placement.capacity import PlacementError
from market_pipeline.placement.policies import POLICY_NAMES

OPENB_DIR = Path("../shared/data/alibaba-gpu-2023")
DEFAULT_NODES = OPENB_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = OPENB_DIR / "openb_pod_list_default.csv"


def register(sub: argparse._SubParsersAction) -> None:
    placement = sub.add_parser("placement", help="placement policies: FGD saturation replay")
    psub = placement.add_subparsers(dest="placement_command", required=True)
    replay = psub.add_parser("replay", help="replay a pod list until the GPU requests fill the cluster")
    _inputs(replay)
    replay.add_argument(
        "--policy",
        action="append",
        choices=POLICY_NAMES,
        help="policy to replay (repeat; default: all three)",
    )
    replay.set_defaults(handler=run_replay)


def register_bench(bench_sub: argparse._SubParsersAction) -> None:
    bench = bench_sub.add_parser("placement", help="saturation replay of all policies on openb (FGD target)")
    _inputs(bench)
    bench.set_defaults(handler=run_replay, policy=None)


def _inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default=str(DEFAULT_NODES), help="node list CSV (openb or spot format)")
    parser.add_argument("--pods", default=str(DEFAULT_PODS), help="openb pod list CSV")


def run_replay(args: argparse.Namespace) -> int:
    try:
        nodes, pods = load_openb_experiment(args.nodes, args.pods)
        result = compare_policies(nodes, pods, args.policy or list(POLICY_NAMES))
    except (FleetSourceError, WorkloadError, PlacementError) as exc:
        print(f"error: placement replay: {exc}", file=sys.stderr)
        return 2
    result["inputs"] = {
        "nodes": args.nodes,
        "pods": args.pods,
        "node_count": nodes.n_nodes,
        "pod_count": len(pods),
    }
    print(json.dumps(result))
    return 0
